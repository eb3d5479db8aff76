/**
 * satchel from Node.js with the satchel-client package: AssembleContext, then StreamContext (each
 * decision as it is made, then the packet). It imports the package by its name, as an
 * application that installed it would (here Node resolves the name to this folder's package).
 *
 *   npm ci && npm run build
 *   node examples/dist/context.js [address] [project] [subject] [query]
 *
 * Defaults come from SATCHEL_ADDRESS (127.0.0.1:50051), SATCHEL_PROJECT (demo), SATCHEL_SUBJECT
 * (user-1) and SATCHEL_QUERY; SATCHEL_API_KEY, when set, is sent as `authorization: Bearer …`.
 * Prints one JSON object per line: the unary packet, each streamed decision, then the streamed
 * packet. Exits 1 on an RPC error (its code and message on stderr).
 */
import type { ServiceError } from "@grpc/grpc-js";
import {
  AssembleContextRequest,
  type ContextPacket,
  createClient,
  DecisionOutcome,
  decisionOutcomeToJSON,
  StreamContextRequest,
  type StreamContextResponse,
  unary,
} from "satchel-client";

const [
  address = process.env.SATCHEL_ADDRESS ?? "127.0.0.1:50051",
  projectId = process.env.SATCHEL_PROJECT ?? "demo",
  subjectId = process.env.SATCHEL_SUBJECT ?? "user-1",
  query = process.env.SATCHEL_QUERY ?? "What should I keep in mind about this user?",
] = process.argv.slice(2);

const DEADLINE_MS = 10_000;

function deadline(): Date {
  return new Date(Date.now() + DEADLINE_MS);
}

function summary(packet: ContextPacket) {
  return {
    status: packet.status,
    tokens_used: packet.tokensUsed,
    budget_tokens: packet.budgetTokens,
    facts: packet.facts.map((f) => ({ id: f.id, statement: f.statement })),
    episodes: packet.episodes.map((e) => ({ event_id: e.eventId, excerpt: e.excerpt })),
    warnings: packet.warnings,
    empty_reason: packet.emptyReason,
  };
}

function print(line: object): void {
  process.stdout.write(JSON.stringify(line) + "\n");
}

async function main(): Promise<void> {
  const satchel = createClient(address, { apiKey: process.env.SATCHEL_API_KEY || undefined });
  try {
    const reply = await unary(
      satchel.context,
      "assembleContext",
      AssembleContextRequest.fromPartial({ projectId, subjectId, query }),
      { deadline: deadline() },
    );
    print({ rpc: "AssembleContext", trace_id: reply.traceId, packet: summary(reply.packet!) });

    const stream = satchel.context.streamContext(
      StreamContextRequest.fromPartial({ projectId, subjectId, query }),
      { deadline: deadline() },
    );
    for await (const message of stream) {
      const { traceId, decision, packet } = message as StreamContextResponse;
      if (decision) {
        print({
          rpc: "StreamContext",
          trace_id: traceId,
          decision: {
            sequence: decision.sequence,
            candidate_id: decision.candidateId,
            outcome: decisionOutcomeToJSON(decision.outcome),
            included: decision.outcome === DecisionOutcome.DECISION_OUTCOME_INCLUDED,
            reason_code: decision.reasonCode,
            score: decision.score,
            budget_used: decision.budgetUsed,
          },
        });
      } else if (packet) {
        print({ rpc: "StreamContext", trace_id: traceId, packet: summary(packet) });
      }
    }
  } finally {
    satchel.close();
  }
}

main().catch((error: ServiceError) => {
  process.stderr.write(`satchel call failed: code=${error.code} ${error.details ?? error.message}\n`);
  process.exit(1);
});
