"""Client APIs translated to and from the one canonical form, an OpenAI chat-completions
body (pure): :mod:`.responses` (the OpenAI Responses API)."""
