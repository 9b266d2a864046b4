"""How long each slow test module takes, for ordering `make test`'s work.

`make test` runs with pytest-xdist's `--dist loadfile`: a module is one unit of work,
handed to the next free worker in the order of the collection. xdist's own default order
(modules with the most tests first) put the slow modules with few tests (Spark, the
Kubernetes runs, the fuzzers) last, and one worker ran them for minutes after the other
had finished. `tests/conftest.py` orders the modules below first, longest first (the
usual longest-processing-time rule), the rest after them in collection order; the
Makefile turns xdist's reordering off.

The figures are seconds summed over a module's tests (setup and teardown included) in a
`make test` run; only the order matters. Refresh them after a module's time changes
much:

    make test PYTEST_ARGS=--junitxml=/tmp/junit.xml
    .venv/bin/python -m tests.durations /tmp/junit.xml   # prints a new SECONDS table
"""

from __future__ import annotations

SECONDS: dict[str, float] = {
    "tests/integration/test_proxy_sdk.py": 263,
    "tests/integration/test_failover.py": 200,
    "tests/compat/test_remoting_clients.py": 190,
    "tests/chaos/test_failover_chaos.py": 157,
    "tests/compat/test_admin_tools5.py": 148,
    "tests/integration/test_analytics_spark.py": 130,
    "tests/integration/test_k8s_local_run.py": 109,
    "tests/compat/test_sdk5_java_parity.py": 100,
    "tests/integration/test_make_run.py": 98,
    "tests/compat/test_default_topics.py": 95,
    "tests/compat/test_mqadmin_apache.py": 93,
    "tests/compat/test_transactions_java.py": 87,
    "tests/integration/test_proxy_transactions.py": 81,
    "tests/chaos/test_chaos.py": 80,
    "tests/compat/test_spring_starter.py": 72,
    "tests/fuzz/test_remoting_fuzz.py": 66,
    "tests/compat/test_launcher.py": 66,
    "tests/compat/test_sdk5_java_tls.py": 63,
    "tests/compat/test_remoting_failover.py": 62,
    "tests/integration/test_pop.py": 59,
    "tests/fuzz/test_rpc_fuzz.py": 46,
    "tests/compat/test_sql92_sdk5.py": 46,
    "tests/compat/test_remoting_tls_java.py": 43,
    "tests/unit/test_k8s_manifests.py": 41,
    "tests/integration/test_pop_client_cli.py": 37,
    "tests/compat/test_apache_master_ferry_slave.py": 36,
    "tests/compat/test_namesrv_apache.py": 35,
    "tests/integration/test_timer.py": 31,
    "tests/integration/test_namesrv_cli.py": 29,
    "tests/compat/test_sql92_remoting.py": 27,
    "tests/unit/test_native.py": 26,
    "tests/unit/test_native_dispatch.py": 25,
    "tests/integration/test_broker_client_cli.py": 25,
    "tests/compat/test_acl_apache.py": 24,
    "tests/chaos/test_transaction_chaos.py": 23,
    "tests/compat/test_ferry_master_apache_slave.py": 22,
    "tests/integration/test_retention_admin.py": 18,
    "tests/compat/test_remoting_failover_etcd.py": 18,
    "tests/integration/test_quiet_shutdown.py": 18,
    "tests/integration/test_metrics_scrape_churn.py": 18,
    "tests/integration/test_acl_admin.py": 18,
    "tests/integration/test_failover_metadata.py": 17,
    "tests/integration/test_message_query_cli.py": 17,
    "tests/unit/test_message_index.py": 13,
    "tests/compat/test_transactions_failover_etcd.py": 12,
    "tests/crash/test_pop_crash.py": 12,
    "tests/crash/test_ha_resume.py": 12,
    "tests/crash/test_storage_faults.py": 12,
    "tests/unit/test_remoting_codec.py": 11,
    "tests/integration/test_failover_remoting.py": 11,
    "tests/unit/test_native_index.py": 10,
    "tests/unit/test_docs_reference.py": 10,
    "tests/integration/test_admin_token.py": 9,
    "tests/unit/test_native_sends.py": 9,
    "tests/fuzz/test_proxy_fuzz.py": 8,
}


def module_of(nodeid: str) -> str:
    """The module path of a test's node id ("tests/unit/test_x.py::test_y[a]")."""
    return nodeid.split("::", 1)[0]


def weight(nodeid: str) -> float:
    return SECONDS.get(module_of(nodeid), 0.0)


def _table(junit: str, least_s: float = 8.0) -> str:
    import collections
    import xml.etree.ElementTree as ET

    totals: collections.Counter[str] = collections.Counter()
    for case in ET.parse(junit).iter("testcase"):
        parts = case.get("classname", "").split(".")
        module = next((i for i, p in enumerate(parts) if p.startswith("test_")), None)
        if module is not None:
            totals["/".join(parts[: module + 1]) + ".py"] += float(case.get("time", 0))
    rows = [f'    "{m}": {s:.0f},' for m, s in totals.most_common() if s >= least_s]
    return "SECONDS: dict[str, float] = {\n" + "\n".join(rows) + "\n}"


if __name__ == "__main__":
    import sys

    print(_table(sys.argv[1]))
