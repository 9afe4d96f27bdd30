"""The native KV data plane: Mooncake Transfer Engine moving real KV bytes (see README.md)."""
