"""Generated protobuf/gRPC code for the tideserve.v1 API (see proto/)."""
