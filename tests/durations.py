"""How long each slow test module takes, for ordering `make test`'s work.

`make test` runs with pytest-xdist's `--dist loadfile`: a module is one unit of work,
handed to the next free worker in the order of the collection. xdist's own default order
(modules with the most tests first) put the slow modules with few tests (Spark, the
Kubernetes runs, the fuzzers) last, and one worker ran them for minutes after the other
had finished. `tests/conftest.py` orders the modules below first, longest first (the
usual longest-processing-time rule), the rest after them in collection order; the
Makefile turns xdist's reordering off. (Before all of them come the modules marked
`apache5`, longest first too: they share their worker's Apache back end while they run
one after another, tests/compat/backends.py.)

The figures are seconds summed over a module's tests (setup and teardown included) in a
`make test` run; only the order matters. Refresh them after a module's time changes
much:

    make test PYTEST_ARGS=--junitxml=/tmp/junit.xml
    .venv/bin/python -m tests.durations /tmp/junit.xml   # prints a new SECONDS table
"""

from __future__ import annotations

SECONDS: dict[str, float] = {
    "tests/integration/test_proxy_sdk.py": 152,
    "tests/compat/test_remoting_clients.py": 136,
    "tests/chaos/test_failover_chaos.py": 115,
    "tests/integration/test_failover.py": 110,
    "tests/integration/test_analytics_spark.py": 109,
    "tests/compat/test_admin_tools5.py": 92,
    "tests/integration/test_k8s_local_run.py": 90,
    "tests/compat/test_sdk5_java_parity.py": 87,
    "tests/compat/test_transactions_java.py": 84,
    "tests/compat/test_default_topics.py": 82,
    "tests/compat/test_sql92_sdk5.py": 74,
    "tests/compat/test_launcher.py": 71,
    "tests/integration/test_proxy_transactions.py": 69,
    "tests/compat/test_sdk5_java_tls.py": 69,
    "tests/compat/test_remoting_failover.py": 67,
    "tests/fuzz/test_remoting_fuzz.py": 65,
    "tests/chaos/test_chaos.py": 63,
    "tests/integration/test_pop.py": 62,
    "tests/compat/test_mqadmin_apache.py": 61,
    "tests/integration/test_make_run.py": 54,
    "tests/compat/test_spring_starter.py": 49,
    "tests/compat/test_apache_master_ferry_slave.py": 43,
    "tests/unit/test_k8s_manifests.py": 41,
    "tests/compat/test_remoting_tls_java.py": 34,
    "tests/fuzz/test_rpc_fuzz.py": 33,
    "tests/integration/test_timer.py": 31,
    "tests/integration/test_pop_client_cli.py": 30,
    "tests/unit/test_native.py": 28,
    "tests/compat/test_acl_apache.py": 28,
    "tests/integration/test_metrics_scrape_churn.py": 26,
    "tests/chaos/test_transaction_chaos.py": 24,
    "tests/compat/test_ferry_master_apache_slave.py": 23,
    "tests/compat/test_sql92_remoting.py": 22,
    "tests/compat/test_namesrv_apache.py": 22,
    "tests/integration/test_namesrv_cli.py": 22,
    "tests/unit/test_native_dispatch.py": 21,
    "tests/integration/test_broker_client_cli.py": 18,
    "tests/integration/test_message_query_cli.py": 17,
    "tests/integration/test_retention_admin.py": 15,
    "tests/integration/test_failover_metadata.py": 15,
    "tests/compat/test_transactions_failover_etcd.py": 14,
    "tests/crash/test_ha_resume.py": 14,
    "tests/integration/test_failover_remoting.py": 13,
    "tests/unit/test_message_index.py": 13,
    "tests/compat/test_remoting_failover_etcd.py": 13,
    "tests/integration/test_acl_admin.py": 13,
    "tests/crash/test_storage_faults.py": 12,
    "tests/crash/test_pop_crash.py": 12,
    "tests/integration/test_etcd_fixture.py": 9,
    "tests/unit/test_native_index.py": 9,
    "tests/unit/test_docs_reference.py": 9,
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
