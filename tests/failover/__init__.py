"""Automatic failover under test: a broker group that elects its master in a real etcd,
producers that remember every attempt, a history checker in the style of Jepsen, and the
fault scenarios that drive them.

Modules, lower ones first (each imports only those above it):

- `config`: the group's settings (lease TTL 2 s, slaveTimeout 1 s, the topic, file sizes).
- `member`: `Member` (one broker process, its ports, store and proxies) and `GroupView`
  (one read of the group's keys in etcd).
- `logs`: a store's commit log read from its files (`read_image`) and the check that the
  members' logs are byte-identical (`assert_identical`).
- `group`: `FailoverGroup`, one name server and N members of broker-a as subprocesses,
  with etcd and HA fault proxies; starts, kills, pauses and restarts members by PID and
  waits (never sleeps) for the group's state.
- `producers`: `Producers`, threads that send and record every `Attempt`.
- `history`: `check_history` and `check_no_overlap`, pure checks of the attempts against
  a log image.
- `outcome`: `Outcome`, what the scenarios measured.
- `steps`: what several scenarios do (freeze a master, check a restarted one rejoins).
- `scenarios`: one fault per function (`kill_master`, `etcd_partition`, `handover`, ...).
- `tables`: topics and subscription groups created just before a failover (`new_topics`).
- `faults`: every fault by name (`FAULTS`, `run_fault`) and `check_final`.

Used by tests/integration/test_failover*.py (few rounds), tests/chaos/test_failover_chaos.py
and test_transaction_chaos.py (FERRY_CHAOS_ROUNDS), and the compat tests that run Apache
clients against an elected group. It holds no tests and starts nothing on import.
"""
