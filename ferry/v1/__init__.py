"""Generated protobuf and gRPC code for the `ferry.v1` API (`make proto` writes it)."""
