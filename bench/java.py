"""Apache Kafka's jars from Maven Central: their classpath, resolved once, and a `java` command.

Role: what the benchmark's Apache Kafka peer (`bench.apache_kafka`), the suite's Java client
checks and its runs of Kafka's command-line tools stand on. `java/pom.xml` pins the version
(`kafka_2.13`, `kafka-tools`, which bring `kafka-clients`, and a log4j2 binding); `classpath()`
has Maven resolve it (`mvn dependency:build-classpath`: the jars land in Maven's own cache,
~/.m2, and the list of their paths in ~/.cache/raftbroker, reused while the POM is unchanged).
`java()` is the command line of a class on that classpath, with a fixed heap.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
import shutil
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

POM = Path(__file__).resolve().parent.parent / "java" / "pom.xml"
CACHE_DIR = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "raftbroker"
RESOLVE_TIMEOUT_S = 600.0  # a first resolution downloads about 90 jars (~60 MB)
VERSION = re.compile(r"<kafka\.version>([^<]+)</kafka\.version>")
# Kafka's own defaults (kafka-run-class.sh's KAFKA_JVM_PERFORMANCE_OPTS), and a fixed heap.
JVM_FLAGS = (
    "-XX:+UseG1GC",
    "-XX:MaxGCPauseMillis=20",
    "-XX:InitiatingHeapOccupancyPercent=35",
    "-XX:+ExplicitGCInvokesConcurrent",
    "-Djava.awt.headless=true",
)


class JavaUnavailableError(RuntimeError):
    """No `java` or no `mvn` on PATH, or Maven could not resolve the POM."""


@dataclass(frozen=True, slots=True)
class Jars:
    """The resolved classpath and where it came from (the report names both)."""

    kafka_version: str
    classpath: str
    source: str

    def java(
        self,
        main_class: str,
        *args: str,
        heap_mb: int = 512,
        system: Mapping[str, str] | None = None,
    ) -> list[str]:
        """The command running `main_class` on this classpath with a fixed heap and the
        system properties `system` (`-Dname=value`)."""
        java = shutil.which("java")
        if java is None:
            raise JavaUnavailableError("no `java` on PATH (Java 17 or newer is needed)")
        heap = (f"-Xms{heap_mb}m", f"-Xmx{heap_mb}m")
        props = [f"-D{k}={v}" for k, v in (system or {}).items()]
        return [java, *heap, *JVM_FLAGS, *props, "-cp", self.classpath, main_class, *args]

    def describe(self) -> dict[str, str]:
        return {"kafka": self.kafka_version, "jars": self.source, "java": java_version()}


def kafka_version() -> str:
    found = VERSION.search(POM.read_text())
    assert found, f"{POM} pins no kafka.version"
    return found.group(1)


def classpath() -> Jars:
    """The POM's classpath, from the cache when the POM has not changed since; else Maven
    resolves it (downloading what ~/.m2 lacks) and the cache keeps the list. Processes that
    ask at once (parallel test workers) take turns: one resolves, the others read its list."""
    digest = hashlib.sha256(POM.read_bytes()).hexdigest()[:16]
    version = kafka_version()
    cached = CACHE_DIR / f"kafka-{version}-{digest}.classpath"
    CACHE_DIR.mkdir(parents=True, exist_ok=True)
    with (CACHE_DIR / "resolve.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        return _cached(version, cached) or _resolve(version, cached)


def _cached(version: str, cached: Path) -> Jars | None:
    if not cached.exists():
        return None
    paths = cached.read_text().strip()
    if not all(Path(p).exists() for p in paths.split(os.pathsep)):
        return None  # a jar removed from ~/.m2 since: resolved again
    return Jars(version, paths, f"Maven Central via ~/.m2 (list cached in {cached})")


def _resolve(version: str, cached: Path) -> Jars:
    mvn = shutil.which("mvn")
    if mvn is None:
        raise JavaUnavailableError("no `mvn` on PATH (Apache Maven resolves Kafka's jars)")
    partial = cached.with_suffix(".partial")
    done = subprocess.run(
        [mvn, "-q", "-B", "-f", str(POM), "dependency:build-classpath",
         f"-Dmdep.outputFile={partial}"],
        capture_output=True, text=True, timeout=RESOLVE_TIMEOUT_S, check=False,
    )  # fmt: skip
    if done.returncode != 0 or not partial.exists():
        raise JavaUnavailableError(f"mvn could not resolve {POM}: {done.stdout[-2000:]}")
    partial.replace(cached)
    return Jars(version, cached.read_text().strip(), f"Maven Central, resolved now by {mvn}")


def java_version() -> str:
    java = shutil.which("java")
    if java is None:
        return "none"
    done = subprocess.run([java, "-version"], capture_output=True, text=True, check=False)
    return done.stderr.splitlines()[0] if done.stderr else "unknown"
