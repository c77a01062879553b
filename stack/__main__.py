"""``python -m stack up|down|status``: start and stop the local servers (``make services-up/-down``): Kafka,
Cassandra and a schema registry.

``up`` starts the servers in the background and records them in ``.stack/state.json``; ``down`` stops
exactly those. Ports and versions come from the flags or ``COUNTERSINK_STACK_*`` variables.
"""

from __future__ import annotations

import argparse
import os
import sys

from stack.servers import (
    CassandraCluster,
    CassandraNode,
    KafkaServer,
    SchemaRegistryServer,
    StackError,
    load_state,
    save_state,
    stop_recorded,
)


def _env_int(name: str, default: int) -> int:
    return int(os.environ.get(f"COUNTERSINK_STACK_{name}", default))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m stack", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    up = sub.add_parser("up", help="start Kafka, Cassandra (single node, or --cassandra-nodes 3) and a schema registry")
    up.add_argument("--kafka-port", type=int, default=_env_int("KAFKA_PORT", 9092))
    up.add_argument("--kafka-controller-port", type=int, default=_env_int("KAFKA_CONTROLLER_PORT", 9093))
    up.add_argument("--cassandra-port", type=int, default=_env_int("CASSANDRA_PORT", 9042))
    up.add_argument("--cassandra-nodes", type=int, choices=(1, 3), default=_env_int("CASSANDRA_NODES", 1))
    up.add_argument("--schema-registry-port", type=int, default=_env_int("SCHEMA_REGISTRY_PORT", 8085))
    up.add_argument("--only", choices=("kafka", "cassandra", "schema-registry"), help="start just one of them")
    up.add_argument("--secure", action="store_true",
                    help="instead: TLS-only Kafka (SASL_SSL SCRAM-SHA-512 on 22192, SSL with client certificates on "
                         "22193) and Cassandra (TLS with client certificates, password roles, on 22142; JMX with a "
                         "login), with fresh certificates and passwords")
    sub.add_parser("down", help="stop what `up` started")
    sub.add_parser("status", help="show what `up` started and whether it still runs")
    args = parser.parse_args(argv)

    try:
        if args.command == "down":
            stopped = stop_recorded()
            print("stopped: " + (", ".join(stopped) if stopped else "nothing was running"))
            return 0
        if args.command == "status":
            for name, entry in load_state().items():
                print(f"{name}: pid {entry['pid']} {entry['endpoint']}")
            return 0
        state = load_state()
        if args.secure:
            return _up_secure(state)
        wanted = ("kafka", "cassandra", "schema-registry") if args.only is None else (args.only,)
        running = [name for name in state if name.split("@")[0] in wanted]
        if running:
            print(f"already started: {', '.join(running)}; run `make services-down` first", file=sys.stderr)
            return 1
        try:
            if args.only in (None, "kafka"):
                kafka = KafkaServer(port=args.kafka_port, controller_port=args.kafka_controller_port)
                seconds = kafka.start()
                assert kafka.process is not None
                state["kafka"] = {"pid": kafka.process.pid, "endpoint": kafka.bootstrap}
                save_state(state)
                print(f"kafka ready on {kafka.bootstrap} in {seconds:.1f}s (logs: {kafka.root}/logs)")
            if args.only in (None, "cassandra"):
                if args.cassandra_nodes == 3:
                    cluster = CassandraCluster(native_port=args.cassandra_port)
                    seconds = cluster.start()
                    for node in cluster.nodes:
                        assert node.process is not None
                        state[f"cassandra@{node.address}"] = {
                            "pid": node.process.pid, "endpoint": f"{node.address}:{node.native_port}"}
                else:
                    node = CassandraNode(native_port=args.cassandra_port)
                    seconds = node.start()
                    assert node.process is not None
                    state["cassandra"] = {"pid": node.process.pid, "endpoint": f"{node.address}:{node.native_port}"}
                save_state(state)
                print(f"cassandra ready ({args.cassandra_nodes} node(s)) in {seconds:.1f}s")
            if args.only in (None, "schema-registry"):
                registry = SchemaRegistryServer(port=args.schema_registry_port)
                seconds = registry.start()
                assert registry.process is not None
                state["schema-registry"] = {"pid": registry.process.pid, "endpoint": registry.url}
                save_state(state)
                print(f"schema registry ready on {registry.url} in {seconds:.1f}s (logs: {registry.root}/logs)")
        except BaseException:
            save_state(state)
            stop_recorded()
            raise
        return 0
    except StackError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


def _up_secure(state: dict[str, dict[str, object]]) -> int:
    """Start the secured pair, record both, and write the settings a countersink process needs."""
    from stack.secure import JMX_USER, SecureStack

    if any(name.startswith("secure-") for name in state):
        print("the secured stack is already started; run `python -m stack down` first", file=sys.stderr)
        return 1
    stack = SecureStack()
    try:
        stack.start()
        assert stack.kafka is not None
        assert stack.cassandra is not None
        assert stack.kafka.process is not None
        assert stack.cassandra.process is not None
        state["secure-kafka"] = {"pid": stack.kafka.process.pid, "endpoint": stack.kafka.bootstrap}
        state["secure-cassandra"] = {"pid": stack.cassandra.process.pid,
                                     "endpoint": f"{stack.cassandra.address}:{stack.cassandra.native_port}"}
        save_state(state)
    except BaseException:
        stack.stop()
        raise
    env_file = stack.root / "countersink.env"
    stack.write_env_file(env_file)
    print(f"secured kafka on {stack.kafka.bootstrap} (SASL_SSL), {stack.kafka.ssl_bootstrap} (SSL, client "
          f"certificates); secured cassandra on {stack.cassandra.address}:{stack.cassandra.native_port}")
    print(f"certificates in {stack.root / 'certs'}; users, roles and passwords in {stack.description_file}")
    print(f"settings of a consumer (mode 0600): set -a; . {env_file}; set +a")
    print(f"nodetool: -h {stack.cassandra.address} -p {stack.cassandra.jmx_port} -u {JMX_USER} "
          f"-pwf {stack.jmx_password_file}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
