import { Option } from 'commander';
import { parseBoolean, record } from './format.js';
import { command } from './help.js';
import { Session } from './session.js';

export function policyCommand() {
  const policy = command('policy', "a tenant's policy", 'toolgate policy get t1');

  policy.addCommand(
    command('get', "a tenant's policy", 'toolgate policy get t1')
      .argument('<tenant>')
      .action(async (tenant: string, _options, cmd) => {
        const s = new Session(cmd);
        const found = await s.call(
          s.api.GET('/tenants/{tenant_id}/policy', { params: { path: { tenant_id: tenant } } }),
        );
        s.print(found, () => record(found));
      }),
  );

  policy.addCommand(
    command(
      'set',
      "replace a tenant's policy (platform-operator)",
      'toolgate policy set t1 --external-call-enabled true',
    )
      .argument('<tenant>')
      .addOption(
        new Option('--external-call-enabled <bool>', "let the tenant's agents use external_call tools")
          .argParser(parseBoolean)
          .makeOptionMandatory(),
      )
      .action(async (tenant: string, options: { externalCallEnabled: boolean }, cmd) => {
        const s = new Session(cmd);
        const set = await s.call(
          s.api.PUT('/tenants/{tenant_id}/policy', {
            params: { path: { tenant_id: tenant } },
            body: { external_call_enabled: options.externalCallEnabled },
          }),
        );
        s.print(set, () => record(set));
      }),
  );
  return policy;
}
