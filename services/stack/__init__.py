"""The local stack: `tideserve up`, `down` and `status`.

Pure planning lives in :mod:`services.stack.plan`; process supervision, state files, port
checks and health probes are the thin shell around it.
"""
