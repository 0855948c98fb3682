import type { FastifyInstance } from 'fastify';
import { z } from 'zod';
import { APPROVAL_KINDS, APPROVAL_STATUSES, approvalStatusAt, type Approval } from '../../runs/approval.js';
import type { ApprovalService } from '../../approvals/approval-service.js';
import type { AuditLog } from '../../audit/audit-log.js';
import { actorOf } from '../../auth/principal.js';
import { operatorOf } from '../auth.js';
import { decodeCursor, encodeCursor } from '../cursor.js';
import { ApiError } from '../errors.js';
import { ownsTenant, refuseCrossTenantObject, tenantInReach } from '../tenant-access.js';
import { parseInput } from '../validation.js';

/** What the approval routes are given by the composition root. */
export interface ApprovalRouteDeps {
  approvals: ApprovalService;
  audit: AuditLog;
  now: () => Date;
}

const listQuery = z.strictObject({
  tenant_id: z.string().min(1).optional(),
  status: z.enum(APPROVAL_STATUSES).optional(),
  kind: z.enum(APPROVAL_KINDS).optional(),
  run_id: z.string().min(1).optional(),
  limit: z.coerce.number().int().min(1).max(200).default(50),
  cursor: z.string().optional(),
});
const cursorSchema = z.object({ created_at: z.iso.datetime(), id: z.string().min(1) });
const idParams = z.strictObject({ id: z.string().min(1).max(100) });
const decisionBody = z.strictObject({
  rationale: z
    .string()
    .max(2000)
    .refine((value) => value.trim().length > 0, 'must not be blank'),
});

/**
 * `/approvals` (operators of the tenant): the proposals waiting for a human and the decisions on
 * them. Agents never reach these routes (`403 agent_forbidden`, audited).
 */
export async function approvalRoutes(app: FastifyInstance, deps: ApprovalRouteDeps): Promise<void> {
  app.get('/approvals', async (request) => {
    const query = parseInput(listQuery, request.query, 'query');
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

  app.get('/approvals/:id', async (request) => {
    const { id } = parseInput(idParams, request.params, 'params');
    return presentApproval(await inReach(request, id), deps.now());
  });

  for (const [path, approve] of [
    ['approve', true],
    ['reject', false],
  ] as const) {
    app.post(`/approvals/:id/${path}`, async (request) => {
      const operator = operatorOf(request);
      const { id } = parseInput(idParams, request.params, 'params');
      const { rationale } = parseInput(decisionBody, request.body, 'body');
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
