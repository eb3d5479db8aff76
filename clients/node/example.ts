/**
 * satchel from Node.js: AssembleContext, then StreamContext (each decision as it is made, then
 * the packet), through the TypeScript stubs that `buf generate` writes to src/gen (ts-proto with
 * @grpc/grpc-js services).
 *
 *   npm ci && npm run build
 *   node dist/example.js [address] [project] [subject] [query]
 *
 * Defaults come from SATCHEL_ADDRESS (127.0.0.1:50051), SATCHEL_PROJECT (demo), SATCHEL_SUBJECT
 * (user-1) and SATCHEL_QUERY. Prints one JSON object per line: the unary packet, each streamed
 * decision, then the streamed packet. Exits 1 on an RPC error (its code and message on stderr).
 */
import { credentials, Metadata, type ServiceError } from "@grpc/grpc-js";
import {
  AssembleContextRequest,
  type AssembleContextResponse,
  type ContextPacket,
  ContextServiceClient,
  DecisionOutcome,
  decisionOutcomeToJSON,
  StreamContextRequest,
  type StreamContextResponse,
} from "./src/gen/satchel/v1/context";

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

function assemble(
  client: ContextServiceClient,
  request: AssembleContextRequest,
): Promise<AssembleContextResponse> {
  return new Promise((resolve, reject) => {
    client.assembleContext(request, new Metadata(), { deadline: deadline() }, (error, reply) =>
      error ? reject(error) : resolve(reply),
    );
  });
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
  const client = new ContextServiceClient(address, credentials.createInsecure());
  try {
    const reply = await assemble(
      client,
      AssembleContextRequest.fromPartial({ projectId, subjectId, query }),
    );
    print({ rpc: "AssembleContext", trace_id: reply.traceId, packet: summary(reply.packet!) });

    const stream = client.streamContext(
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
    client.close();
  }
}

main().catch((error: ServiceError) => {
  process.stderr.write(`satchel call failed: code=${error.code} ${error.details ?? error.message}\n`);
  process.exit(1);
});
