"""compose/ cannot rot: each service's exact command and node config, run as local processes.

No Docker engine runs here, so the test reads compose/docker-compose.yml and the Dockerfile's
ENTRYPOINT, and starts every service's command with its mounted node TOML, the service names
mapped to loopback addresses (127.0.0.2-4) and the data directory moved to a temporary one;
every other setting (ports, secret, peers) is used as written. Then it creates a topic,
produces and consumes through the cluster, and runs each service's healthcheck command.
"""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from cluster.client import Admin, Cluster, Consumer, Producer
from cluster.local import launcher
from tests.cluster.procs import REPO, running, spawn
from tests.polling import apoll_until

pytestmark = pytest.mark.asyncio(loop_scope="function")
COMPOSE = REPO / "compose"
CONFIG_IN_CONTAINER = "/etc/raftbroker/node.toml"


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


def local_config(source: Path, hosts: dict[str, str], data_dir: Path, target: Path) -> None:
    text = source.read_text()
    for name, address in hosts.items():
        text = text.replace(f'"{name}"', f'"{address}"')
    text = text.replace('data_dir = "/var/lib/raftbroker"', f'data_dir = "{data_dir}"')
    target.write_text(text)


def ports_free(hosts: dict[str, str]) -> bool:
    for address in hosts.values():
        for port in (9092, 8092, 19092, 19093):
            with socket.socket() as s:
                try:
                    s.bind((address, port))
                except OSError:
                    return False
    return True


async def test_the_compose_services_form_a_working_cluster(tmp_path: Path) -> None:
    spec = services()
    hosts = {name: f"127.0.0.{i + 2}" for i, name in enumerate(sorted(spec))}
    if not ports_free(hosts):
        pytest.skip("the compose ports (9092, 8092, 19092-19093) are busy on 127.0.0.2-4")
    procs = []
    for name, service in sorted(spec.items()):
        config = tmp_path / f"{name}.toml"
        local_config(mounted_config(service), hosts, tmp_path / name, config)
        argv = entrypoint() + list(service["command"])
        procs.append(spawn(local_command(argv, hosts, config), tmp_path / f"{name}.log"))
    with running(procs):
        nodes = tuple(
            launcher.NodeProcess(i + 1, address, 9092, 19092, 8092, proc.pid)
            for i, (address, proc) in enumerate(zip(hosts.values(), procs, strict=True))
        )
        await launcher.wait_ready(launcher.LocalCluster(tmp_path, nodes), 60)
        client = Cluster([f"{address}:9092" for address in hosts.values()])
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
