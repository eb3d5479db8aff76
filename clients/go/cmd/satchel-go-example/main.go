// Command satchel-go-example calls satchel from Go through the stubs generated from proto/:
// it asserts two facts, opens a conflict between them, lists the scope's conflicts page by
// page, assembles a context and prints each decision with its ReasonCode.
//
//	clients/go/build && clients/go/bin/satchel-go-example -address 127.0.0.1:50051
//
// or, with the module fetched: go run example.com/satchel/clients/go/cmd/satchel-go-example@latest
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/structpb"

	satchelv1 "example.com/satchel/clients/go/satchel/v1"
)

func main() {
	address := flag.String("address", "127.0.0.1:50051", "satchel's gRPC address")
	project := flag.String("project", fmt.Sprintf("go-example-%d", time.Now().UnixNano()), "project id")
	flag.Parse()

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := grpc.DialContext(ctx, *address, grpc.WithInsecure(), grpc.WithBlock())
	if err != nil {
		log.Fatalf("dial %s: %v", *address, err)
	}
	defer conn.Close()
	memory := satchelv1.NewMemoryServiceClient(conn)
	contexts := satchelv1.NewContextServiceClient(conn)
	const subject = "maya"

	var ids []string
	for _, city := range []string{"Lisbon", "Porto"} {
		value, err := structpb.NewValue(city)
		if err != nil {
			log.Fatal(err)
		}
		reply, err := memory.AssertFact(ctx, &satchelv1.AssertFactRequest{
			ProjectId: *project, SubjectId: subject, Predicate: "home_city", Value: value,
		})
		if err != nil {
			log.Fatalf("AssertFact: %v", err)
		}
		ids = append(ids, reply.GetFact().GetId())
	}
	if _, err := memory.AssertFact(ctx, &satchelv1.AssertFactRequest{
		ProjectId: *project, SubjectId: subject, Predicate: "job",
		Value: structpb.NewStringValue("nurse"), Statement: "Maya works night shifts as a nurse",
	}); err != nil {
		log.Fatalf("AssertFact: %v", err)
	}
	if _, err := memory.OpenConflict(ctx, &satchelv1.OpenConflictRequest{
		ProjectId: *project, SubjectId: subject, FactIds: ids, Note: "two homes",
	}); err != nil {
		log.Fatalf("OpenConflict: %v", err)
	}

	conflicts := 0
	request := &satchelv1.ListConflictsRequest{ProjectId: *project, SubjectId: subject, PageSize: 1}
	for {
		page, err := memory.ListConflicts(ctx, request)
		if err != nil {
			log.Fatalf("ListConflicts: %v", err)
		}
		conflicts += len(page.GetConflicts())
		if page.GetNextPageToken() == "" {
			break
		}
		request.PageToken = page.GetNextPageToken()
	}
	fmt.Printf("open conflicts: %d\n", conflicts)

	reply, err := contexts.AssembleContext(ctx, &satchelv1.AssembleContextRequest{
		ProjectId: *project, SubjectId: subject, Query: "Where does Maya live and work?",
	})
	if err != nil {
		log.Fatalf("AssembleContext: %v", err)
	}
	packet := reply.GetPacket()
	fmt.Printf("packet: %s, %d fact(s), %d/%d tokens\n", packet.GetStatus(),
		len(packet.GetFacts()), packet.GetTokensUsed(), packet.GetBudgetTokens())
	for _, fact := range packet.GetFacts() {
		fmt.Printf("  fact: %s\n", fact.GetStatement())
	}
	trace, err := contexts.GetTrace(ctx, &satchelv1.GetTraceRequest{
		ProjectId: *project, TraceId: reply.GetTraceId(),
	})
	if err != nil {
		log.Fatalf("GetTrace: %v", err)
	}
	for _, d := range trace.GetTrace().GetDecisions() {
		fmt.Printf("  decision %d: %s %s (%s)\n", d.GetSequence(), d.GetOutcome(), d.GetReason(),
			d.GetReasonCode())
	}
}
