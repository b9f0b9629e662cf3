"""compose/ cannot rot: each service's exact command and node config, run as local processes.

No Docker engine runs here, so the test reads compose/docker-compose.yml and the Dockerfile's
ENTRYPOINT, and starts every service's command with its mounted node TOML, the service names
mapped to loopback addresses (127.0.0.2-4), the data directory moved to a temporary one and
each Docker secret a file made as compose/README.md's first step makes it; every other setting
(ports, the secret file's path, peers) is used as written. Then it creates a topic, produces
and consumes through the cluster, lists it with kcat on the Kafka port compose publishes, and
runs each service's healthcheck command.

The cluster secret is in no committed file: no node config sets `cluster_secret`, and the
Docker secret's source file is git-ignored and created by the README's first step.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import secrets
import subprocess
import sys
import tomllib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from cluster.client import Admin, Client, Consumer, Producer
from cluster.local import launcher
from tests.cluster.conftest import uses_conventional_ports
from tests.cluster.procs import REPO, running, spawn
from tests.polling import apoll_until

# `cluster up` takes the conventional ports when they are free: one test process at a time.
pytestmark = uses_conventional_ports()

COMPOSE = REPO / "compose"
CONFIG_IN_CONTAINER = "/etc/raftbroker/node.toml"
SECRETS_IN_CONTAINER = "/run/secrets"


async def kcat(*args: str, stdin: str | None = None) -> str:
    done = await asyncio.to_thread(
        subprocess.run,
        ["kcat", *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def docker_secrets() -> dict[str, str]:
    """Each top-level Docker secret's name and source file (relative to compose/)."""
    spec = yaml.safe_load((COMPOSE / "docker-compose.yml").read_text())
    return {name: str(source["file"]) for name, source in spec["secrets"].items()}


def make_secrets(tmp_path: Path) -> dict[str, Path]:
    """The secret files, made as compose/README.md's first step makes them."""
    made = {}
    for name in docker_secrets():
        made[name] = tmp_path / f"secret-{name}"
        made[name].write_text(secrets.token_urlsafe(32) + "\n")
    return made


def services() -> dict[str, dict[str, Any]]:
    spec = yaml.safe_load((COMPOSE / "docker-compose.yml").read_text())
    found: dict[str, dict[str, Any]] = spec["services"]
    return found


def entrypoint() -> list[str]:
    for line in (COMPOSE / "Dockerfile").read_text().splitlines():
        if line.startswith("ENTRYPOINT"):
            found: list[str] = json.loads(line.removeprefix("ENTRYPOINT"))
            return found
    raise AssertionError("the Dockerfile has no ENTRYPOINT")


def local_command(argv: list[str], hosts: dict[str, str], config: Path) -> list[str]:
    """A container command as a local process: the console script, hosts and paths mapped."""
    assert argv[0] == "raftbroker", argv
    mapped = [config.as_posix() if a == CONFIG_IN_CONTAINER else a for a in argv[1:]]
    for name, address in hosts.items():
        mapped = [a.replace(f"{name}:", f"{address}:") for a in mapped]
    return ["-m", "cli", *mapped]


def mounted_config(service: dict[str, Any]) -> Path:
    for volume in service["volumes"]:
        source, target, *_ = volume.split(":")
        if target == CONFIG_IN_CONTAINER:
            return COMPOSE / str(source)
    raise AssertionError(f"no volume mounts {CONFIG_IN_CONTAINER}")


def local_config(
    source: Path, hosts: dict[str, str], data_dir: Path, secret_files: dict[str, Path], target: Path
) -> None:
    text = source.read_text()
    for name, address in hosts.items():
        text = text.replace(f'"{name}"', f'"{address}"')
    text = text.replace('data_dir = "/var/lib/raftbroker"', f'data_dir = "{data_dir}"')
    for name, path in secret_files.items():
        text = text.replace(f'"{SECRETS_IN_CONTAINER}/{name}"', f'"{path}"')
    target.write_text(text)


def test_the_cluster_secret_is_in_no_committed_file() -> None:
    sources = docker_secrets()
    assert "cluster_secret" in sources
    ignored = (COMPOSE / ".gitignore").read_text().splitlines()
    readme = (COMPOSE / "README.md").read_text()
    for source in sources.values():
        assert source.removeprefix("./") in ignored, f"{source} is not git-ignored"
        assert f"> compose/{source.removeprefix('./')}" in readme, "the README does not make it"
    for name, service in services().items():
        assert "cluster_secret" in service["secrets"], f"{name} does not get the secret"
        config = mounted_config(service).read_text()
        assert "\ncluster_secret =" not in config, f"{name}'s config holds a secret"
        assert f'cluster_secret_file = "{SECRETS_IN_CONTAINER}/cluster_secret"' in config


def ports_free(hosts: dict[str, str]) -> bool:
    ports = (9192, 9092, 8092, 19092, 19093, *EXTERNAL_PORTS)
    return all(
        launcher.port_free(address, port)
        for address in (*hosts.values(), PUBLISHED_HOST)
        for port in ports
    )


EXTERNAL_PORTS = (29092, 29093, 29094)
PUBLISHED_HOST = "127.0.0.1"


def published_kafka_ports(spec: dict[str, dict[str, Any]]) -> dict[str, tuple[int, int]]:
    """Each service's external Kafka listener as compose publishes it: (host port, container
    port), from its `ports` and its node config's `kafka_external_port`."""
    found = {}
    for name, service in spec.items():
        config = tomllib.loads(mounted_config(service).read_text())
        container_port = config["kafka_external_port"]
        for mapping in service.get("ports", []):
            host, host_port, port = mapping.split(":")
            if int(port) == container_port:
                assert host == PUBLISHED_HOST, mapping
                found[name] = (int(host_port), container_port)
    return found


@contextlib.asynccontextmanager
async def publishing(routes: dict[int, tuple[str, int]]) -> AsyncIterator[None]:
    """What Docker's port publishing does, on this host: 127.0.0.1:PORT forwarded to a
    container's address and port (here, a node's loopback address)."""

    async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError):
            while data := await reader.read(65_536):
                writer.write(data)
                await writer.drain()
        writer.close()

    async def forward(
        target: tuple[str, int], reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        try:
            async with asyncio.timeout(5):
                upstream_reader, upstream_writer = await asyncio.open_connection(*target)
        except (OSError, TimeoutError):
            writer.close()
            return
        await asyncio.gather(pipe(reader, upstream_writer), pipe(upstream_reader, writer))

    servers = [
        await asyncio.start_server(functools.partial(forward, target), PUBLISHED_HOST, port)
        for port, target in routes.items()
    ]
    try:
        yield
    finally:
        for server in servers:
            server.close()


@pytest.mark.kcat
@pytest.mark.asyncio(loop_scope="function")
async def test_the_compose_services_form_a_working_cluster(tmp_path: Path) -> None:
    spec = services()
    hosts = {name: f"127.0.0.{i + 2}" for i, name in enumerate(sorted(spec))}
    if not ports_free(hosts):
        pytest.skip("the compose ports (9092, 9192, 8092, 19092-19093) are busy on 127.0.0.2-4")
    procs = []
    secret_files = make_secrets(tmp_path)
    for name, service in sorted(spec.items()):
        config = tmp_path / f"{name}.toml"
        local_config(mounted_config(service), hosts, tmp_path / name, secret_files, config)
        argv = entrypoint() + list(service["command"])
        procs.append(spawn(local_command(argv, hosts, config), tmp_path / f"{name}.log"))
    with running(procs):
        nodes = tuple(
            launcher.NodeProcess(i + 1, address, 9192, 19092, 8092, proc.pid, kafka_port=9092)
            for i, (address, proc) in enumerate(zip(hosts.values(), procs, strict=True))
        )
        await launcher.wait_ready(launcher.LocalCluster(tmp_path, nodes), 60)
        client = Client([f"{address}:9192" for address in hosts.values()])
        try:
            await Admin(client).create_topic("compose", 3, 3)
            async with Producer(client) as producer:
                futures = [await producer.send("compose", f"c{i}".encode()) for i in range(1_000)]
                await asyncio.gather(*futures)
            consumer = Consumer(client)
            await consumer.assign("compose")
            values: list[bytes] = []

            async def all_consumed() -> bool:
                values.extend(r.value or b"" for r in await consumer.poll(1_000))
                return len(values) >= 1_000

            await apoll_until(all_consumed, 60, "the 1,000 records consumed")
            assert sorted(values) == sorted(f"c{i}".encode() for i in range(1_000))
        finally:
            await client.close()
        # Kafka's clients on the compose network reach each node's kafka_port, by its name
        metadata = json.loads(await kcat("-L", "-J", "-b", f"{hosts['raftbroker-1']}:9092"))
        assert sorted(b["name"] for b in metadata["brokers"]) == [
            f"{a}:9092" for a in hosts.values()
        ]
        assert [t["topic"] for t in metadata["topics"]] == ["compose"]
        # and those on the host (issue 41: the brokers advertised only their service names)
        # through the published ports: Metadata there names each node by its published port.
        published = published_kafka_ports(spec)
        assert sorted(published) == sorted(spec), "every node's external listener published"
        routes = {h: (hosts[name], c) for name, (h, c) in published.items()}
        async with publishing(routes):
            outside = f"{PUBLISHED_HOST}:{published['raftbroker-1'][0]}"
            metadata = json.loads(await kcat("-L", "-J", "-b", outside))
            assert sorted(b["name"] for b in metadata["brokers"]) == sorted(
                f"{PUBLISHED_HOST}:{h}" for h, _ in published.values()
            )
            await kcat("-P", "-b", outside, "-t", "compose", "-p", "1", stdin="from-the-host\n")
            read = await kcat("-C", "-b", outside, "-t", "compose", "-p", "1", "-o", "-1", "-e")
            assert read == "from-the-host\n"
        for name, service in spec.items():
            check = service["healthcheck"]["test"]
            assert check[0] == "CMD"
            argv = local_command(check[1:], hosts, tmp_path / "unused.toml")
            result = await asyncio.to_thread(
                subprocess.run,
                [sys.executable, *argv],
                cwd=REPO,
                capture_output=True,
                text=True,
                timeout=60,
                check=False,
            )
            assert result.returncode == 0, f"{name} healthcheck: {result.stderr}"
            assert len(json.loads(result.stdout)["nodes"]) == 3
