"""The OpenAI-compatible HTTP gateway (aiohttp shell over the service core): parsing, the
server, forwarding to engines (P/D flows), relaying answers, pre-emption, metrics, records."""
