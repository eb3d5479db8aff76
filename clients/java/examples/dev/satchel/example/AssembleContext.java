package dev.satchel.example;

import dev.satchel.v1.AssembleContextRequest;
import dev.satchel.v1.AssembleContextResponse;
import dev.satchel.v1.ContextServiceGrpc;
import dev.satchel.v1.PacketFact;
import io.grpc.ManagedChannel;
import io.grpc.ManagedChannelBuilder;
import io.grpc.Metadata;
import io.grpc.StatusRuntimeException;
import io.grpc.stub.MetadataUtils;
import java.util.concurrent.TimeUnit;

/**
 * satchel from Java through the classes that clients/java/build generates and compiles:
 * AssembleContext, printed as one JSON line (trace id, then each fact's id and statement).
 *
 * <pre>
 *   clients/java/build
 *   java -cp "$(cat clients/java/build/classpath)" dev.satchel.example.AssembleContext \
 *     127.0.0.1:50051 demo user-1 "Where does Caroline live?"
 * </pre>
 *
 * SATCHEL_API_KEY, when set, is sent as {@code authorization: Bearer <key>}. Exits 1 on an RPC
 * error, its status on stderr.
 */
public final class AssembleContext {
  private AssembleContext() {}

  public static void main(String[] args) throws InterruptedException {
    String address = args.length > 0 ? args[0] : "127.0.0.1:50051";
    String project = args.length > 1 ? args[1] : "demo";
    String subject = args.length > 2 ? args[2] : "user-1";
    String query = args.length > 3 ? args[3] : "What should I keep in mind about this user?";
    ManagedChannel channel = ManagedChannelBuilder.forTarget(address).usePlaintext().build();
    try {
      ContextServiceGrpc.ContextServiceBlockingStub stub =
          ContextServiceGrpc.newBlockingStub(channel).withDeadlineAfter(10, TimeUnit.SECONDS);
      String apiKey = System.getenv("SATCHEL_API_KEY");
      if (apiKey != null && !apiKey.isEmpty()) {
        Metadata metadata = new Metadata();
        metadata.put(
            Metadata.Key.of("authorization", Metadata.ASCII_STRING_MARSHALLER), "Bearer " + apiKey);
        stub = stub.withInterceptors(MetadataUtils.newAttachHeadersInterceptor(metadata));
      }
      AssembleContextResponse reply =
          stub.assembleContext(
              AssembleContextRequest.newBuilder()
                  .setProjectId(project)
                  .setSubjectId(subject)
                  .setQuery(query)
                  .build());
      StringBuilder line = new StringBuilder("{\"trace_id\": ").append(quote(reply.getTraceId()));
      line.append(", \"status\": ").append(quote(reply.getPacket().getStatus().name()));
      line.append(", \"facts\": [");
      String separator = "";
      for (PacketFact fact : reply.getPacket().getFactsList()) {
        line.append(separator).append('[').append(quote(fact.getId())).append(", ");
        line.append(quote(fact.getStatement())).append(']');
        separator = ", ";
      }
      System.out.println(line.append("]}"));
    } catch (StatusRuntimeException error) {
      System.err.println("satchel call failed: " + error.getStatus());
      System.exit(1);
    } finally {
      channel.shutdownNow().awaitTermination(5, TimeUnit.SECONDS);
    }
  }

  private static String quote(String text) {
    StringBuilder out = new StringBuilder("\"");
    for (char c : text.toCharArray()) {
      if (c == '"' || c == '\\') {
        out.append('\\').append(c);
      } else if (c < 0x20) {
        out.append(String.format("\\u%04x", (int) c));
      } else {
        out.append(c);
      }
    }
    return out.append('"').toString();
  }
}
