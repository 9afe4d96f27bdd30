"""tideserve.v1: generated from the .proto files in this directory by scripts/gen_proto.py."""
