"""Kafka's own Java client and command-line tools, run from the tests.

`JavaClient` runs `java/ClientDriver.java` (kafka-clients, Kafka's reference client) as a
single-file source program on the classpath `bench.java` resolves from Maven Central, and calls
it over its line protocol (a JSON request a line on stdin, events and one answer on stdout); its
log (log4j2, with the network client's API version negotiation at DEBUG) is kept for the test
to read. `kafka_tool` runs one of Kafka's command-line tools (`kafka-tools`) to completion.

Where Java or Maven is missing the tests that need them are skipped with the reason
(`JAVA_MISSING`), unless RAFTBROKER_REQUIRE_JAVA=1 (as .ci/run sets, having installed both).
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from bench.java import Jars, JavaUnavailableError, classpath

REPO = Path(__file__).resolve().parents[1]
DRIVER = REPO / "java" / "ClientDriver.java"
READY_TIMEOUT_S = 60.0  # a JVM compiling the driver on a loaded 2-core machine
CALL_TIMEOUT_S = 120.0
TOOL_TIMEOUT_S = 120.0
JAVA_MISSING = "Java 17+ and Apache Maven are needed (apt-get install openjdk-17-jdk maven)"
# The client's log: warnings, and the API versions each node offered and the client chose.
LOG4J2 = """\
status = warn
appender.err.type = Console
appender.err.name = ERR
appender.err.target = SYSTEM_ERR
appender.err.layout.type = PatternLayout
appender.err.layout.pattern = %p %c{1} %m%n
rootLogger.level = WARN
rootLogger.appenderRef.err.ref = ERR
logger.net.name = org.apache.kafka.clients.NetworkClient
logger.net.level = DEBUG
"""

# The tools' log: warnings and errors only, on stderr (their output is stdout).
TOOLS_LOG4J2 = LOG4J2.split("logger.net.name", maxsplit=1)[0]

Event = dict[str, Any]


def jars_or_skip() -> Jars:
    """The resolved classpath; the test is skipped (or fails, where Java is required) when
    Java or Maven is missing."""
    try:
        if shutil.which("javac") is None:  # the driver runs as a source program: a JDK's
            raise JavaUnavailableError("no `javac` on PATH (a JDK, not only a JRE)")
        return classpath()
    except JavaUnavailableError as exc:
        if os.environ.get("RAFTBROKER_REQUIRE_JAVA") == "1":
            raise
        pytest.skip(f"{JAVA_MISSING}: {exc}")


def log4j_file(text: str = LOG4J2, name: str = "client") -> Path:
    path = Path(tempfile.gettempdir()) / f"raftbroker-tests-java-{name}-log4j2.properties"
    path.write_text(text)
    return path


@dataclass(eq=False)  # a client is itself: a key of the tests' tables
class JavaClient:
    """A running driver: `call` sends a request and returns its answer (events before it go
    to `on_event`); `log` is what the client logged so far."""

    proc: subprocess.Popen[str]
    lines: queue.Queue[str | None] = field(default_factory=queue.Queue)
    stderr: list[str] = field(default_factory=list)

    readers: list[threading.Thread] = field(default_factory=list)

    def __post_init__(self) -> None:
        for read in (self._read_stdout, self._read_stderr):
            reader = threading.Thread(target=read, daemon=True)
            reader.start()
            self.readers.append(reader)

    def _read_stdout(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line)
        self.lines.put(None)

    def _read_stderr(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.stderr.append(line)

    @property
    def log(self) -> str:
        return "".join(self.stderr)

    def next_line(self, timeout_s: float) -> Event:
        try:
            line = self.lines.get(timeout=timeout_s)
        except queue.Empty:
            raise TimeoutError(f"the Java client said nothing in {timeout_s} s") from None
        if line is None:
            raise RuntimeError(f"the Java client exited: {self.log[-3000:]}")
        event: Event = json.loads(line)
        return event

    def send(self, request: dict[str, Any]) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()

    def answer(
        self, on_event: Callable[[Event], None] | None = None, timeout_s: float = CALL_TIMEOUT_S
    ) -> Event:
        while True:
            event = self.next_line(timeout_s)
            if "event" not in event:
                return event
            if on_event is not None:
                on_event(event)

    def call(
        self,
        request: dict[str, Any],
        on_event: Callable[[Event], None] | None = None,
        timeout_s: float = CALL_TIMEOUT_S,
    ) -> Event:
        self.send(request)
        answer = self.answer(on_event, timeout_s)
        assert "error" not in answer, f"{request['op']}: {answer} (log: {self.log[-2000:]})"
        return answer

    def kill(self) -> None:
        """SIGKILL (a member's crash: no LeaveGroup); its pipes closed once it is gone."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(30)
        self.close()

    def close(self) -> None:
        for reader in self.readers:
            reader.join(10)
        for pipe in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            if pipe is not None:
                with contextlib.suppress(OSError):
                    pipe.close()


@dataclass(frozen=True, slots=True)
class JavaClients:
    """Starts drivers against one cluster; every one started is stopped when the block ends."""

    jars: Jars
    bootstrap: str
    started: list[JavaClient] = field(default_factory=list)

    def start(self) -> JavaClient:
        command = self.jars.java(
            str(DRIVER), self.bootstrap, heap_mb=256,
            system={"log4j2.configurationFile": str(log4j_file())},
        )  # fmt: skip
        proc = subprocess.Popen(
            command,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        client = JavaClient(proc)
        self.started.append(client)
        ready = client.next_line(READY_TIMEOUT_S)
        assert ready == {"event": "ready"}, ready
        return client


def java_clients(bootstrap: list[str]) -> Iterator[JavaClients]:
    """For a fixture: a starter of Java clients of `bootstrap`, all stopped after."""
    clients = JavaClients(jars_or_skip(), ",".join(bootstrap))
    try:
        yield clients
    finally:
        for client in clients.started:
            with_quit(client)


def with_quit(client: JavaClient) -> None:
    """Ask the driver to quit; kill it if it does not within 10 s."""
    try:
        if client.proc.poll() is None:
            client.send({"op": "quit"})
            client.proc.wait(10)
    except (OSError, subprocess.TimeoutExpired):
        pass
    client.kill()


def kafka_tool(
    jars: Jars, main_class: str, *args: str, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    """One of Kafka's command-line tools (a class of kafka-tools), run to completion."""
    return subprocess.run(
        jars.java(main_class, *args, heap_mb=256,
                  system={"log4j2.configurationFile": str(log4j_file(TOOLS_LOG4J2, "tools"))}),
        input=stdin, capture_output=True, text=True, timeout=TOOL_TIMEOUT_S, check=False,
    )  # fmt: skip
