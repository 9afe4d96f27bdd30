"""Trace-replay benchmark (``tideserve bench``): readers, prompt synthesis, client, stats."""
