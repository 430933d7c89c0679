"""What people see of the fleet: `miro status`/`watch` snapshots, Prometheus metrics, the charts' time series, and
URLs shown without their secrets."""
