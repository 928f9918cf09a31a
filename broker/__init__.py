"""The gRPC brokers that serve clients and follow the metadata quorum."""
