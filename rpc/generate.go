package rpc

// Regenerate the gRPC code with the pinned generators of the tools module
// (needs protoc: Debian package protobuf-compiler).
//go:generate sh -c "cd ../tools && go build -o ../rpc/.bin/ google.golang.org/protobuf/cmd/protoc-gen-go google.golang.org/grpc/cmd/protoc-gen-go-grpc"
//go:generate protoc --plugin=protoc-gen-go=.bin/protoc-gen-go --plugin=protoc-gen-go-grpc=.bin/protoc-gen-go-grpc --go_out=cbv1 --go_opt=paths=source_relative --go-grpc_out=cbv1 --go-grpc_opt=paths=source_relative blend.proto worker.proto
