"""The gateway's request-side core (pure): intake, request records, tool calls and session
turns. The routing and admission core it drives is ``services.common.scheduling``."""
