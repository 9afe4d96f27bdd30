"""The local stack: `tideserve up`, `down` and `status`.

Pure planning lives in :mod:`services.stack.plan` (services, ports) and
:mod:`services.stack.engines` (simulated engines and how the scheduler learns of them);
process supervision, state files, port checks and health probes are the thin shell around it.
"""
