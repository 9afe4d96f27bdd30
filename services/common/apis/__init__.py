"""Translations between the client APIs the gateway and the engine simulator speak (pure).

- :mod:`.anthropic`: the Anthropic Messages API ⇄ OpenAI chat completions.
"""
