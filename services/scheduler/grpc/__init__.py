"""The gRPC ``tideserve.v1.SchedulerService`` servicer (translation over the service core)."""
