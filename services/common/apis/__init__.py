"""Client APIs translated to and from the one canonical form, an OpenAI chat-completions
body (pure), shared by the gateway and the engine simulator:

- :mod:`.anthropic`: the Anthropic Messages API;
- :mod:`.responses`: the OpenAI Responses API.
"""
