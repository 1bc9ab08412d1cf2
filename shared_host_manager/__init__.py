"""shared_host_manager: the scheduler-side host-state cache and decision path.

Runs inside each scheduler process: consumes the host-state stream, keeps every
source's document in memory through :class:`protocol.receiver.ReceiverMachine`,
and decides placements with no database read.
"""
