import type { FastifyInstance } from 'fastify';
import { z } from 'zod';
import type { operations } from '../../client/openapi-types.js';
import { approvalStatusAt, type Approval } from '../../runs/approval.js';
import type { ApprovalService } from '../../approvals/approval-service.js';
import type { AuditLog } from '../../audit/audit-log.js';
import { actorOf } from '../../auth/principal.js';
import { operatorOf } from '../auth.js';
import { decodeCursor, encodeCursor } from '../cursor.js';
import { ApiError } from '../errors.js';
import { ownsTenant, refuseCrossTenantObject, tenantInReach } from '../tenant-access.js';
import type { Defaulted } from '../validation.js';

/** What the approval routes are given by the composition root. */
export interface ApprovalRouteDeps {
  approvals: ApprovalService;
  audit: AuditLog;
  now: () => Date;
}

type ListQuery = Defaulted<operations['listApprovals']['parameters']['query'], 'limit'>;
type IdParams = { id: string };
type DecisionBody = { rationale: string };

const cursorSchema = z.object({ created_at: z.iso.datetime(), id: z.string().min(1) });

/**
 * `/approvals` (operators of the tenant): the proposals waiting for a human and the decisions on
 * them. Agents never reach these routes (`403 agent_forbidden`, audited).
 */
export async function approvalRoutes(app: FastifyInstance, deps: ApprovalRouteDeps): Promise<void> {
  app.get<{ Querystring: ListQuery }>('/approvals', async (request) => {
    const query = request.query;
    const tenantId = await tenantInReach(request, deps.audit, query.tenant_id);
    const page = await deps.approvals.list({
      tenantId,
      status: query.status,
      kind: query.kind,
      runId: query.run_id,
      after: query.cursor === undefined ? undefined : decodeCursor(query.cursor, cursorSchema),
      limit: query.limit,
    });
    const now = deps.now();
    return {
      items: page.items.map((a) => presentApproval(a, now)),
      next_cursor: page.next ? encodeCursor(page.next) : null,
    };
  });

  const inReach = async (request: Parameters<typeof operatorOf>[0], id: string): Promise<Approval> => {
    const approval = await deps.approvals.get(id);
    if (!approval) throw new ApiError('not_found', `approval ${id} not found`);
    if (!ownsTenant(request, approval.tenant_id))
      await refuseCrossTenantObject(request, deps.audit, { approval_id: id }, `approval ${id} not found`);
    return approval;
  };

  app.get<{ Params: IdParams }>('/approvals/:id', async (request) => {
    const { id } = request.params;
    return presentApproval(await inReach(request, id), deps.now());
  });

  for (const [path, approve] of [
    ['approve', true],
    ['reject', false],
  ] as const) {
    app.post<{ Params: IdParams; Body: DecisionBody }>(`/approvals/:id/${path}`, async (request) => {
      const operator = operatorOf(request);
      const { id } = request.params;
      const { rationale } = request.body;
      await inReach(request, id);
      const result = await deps.approvals.decide({
        id,
        approve,
        rationale,
        approver: { actor: actorOf(operator), role: operator.role },
        traceId: request.traceId,
      });
      if (!result.ok) throw new ApiError(result.code, result.message, result.details ?? {});
      return presentApproval(result.approval, deps.now());
    });
  }
}

function presentApproval(approval: Approval, now: Date) {
  return {
    ...approval,
    status: approvalStatusAt(approval, now),
    created_at: approval.created_at.toISOString(),
    expires_at: approval.expires_at.toISOString(),
    decided_at: approval.decided_at === null ? null : approval.decided_at.toISOString(),
  };
}
