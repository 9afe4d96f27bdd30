"""Processes on one machine: shared by the local stack (``tideserve up/down/status``) and the
autoscaler's ``local`` driver, and read by the CLIs that look for a running local stack.

- :mod:`~services.common.local.spec`: what a supervised process is (:class:`ChildSpec`) and
  the ports it listens on (:class:`PortClaim`), pure;
- :mod:`~services.common.local.procs`: the process supervisor, pid + start time references;
- :mod:`~services.common.local.ports`: bind and connect probes;
- :mod:`~services.common.local.recorded`: engine processes recorded by whoever runs them;
- :mod:`~services.common.local.state`: the local stack's state file (``stack.json``);
- :mod:`~services.common.local.client`: how a CLI finds the local stack (its state
  directory, its admin token).
"""
