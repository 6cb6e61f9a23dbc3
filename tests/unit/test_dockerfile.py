"""The Dockerfile, read as text: no Docker engine is needed (nor available in CI).

Instructions are parsed the way Docker reads them (continuation lines joined, comments dropped)
and checked stage by stage, and against the Helm chart that runs the image.
"""

from __future__ import annotations

import fnmatch
import json
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "Dockerfile"
EXTRAS = "postgresql,sqlserver,kafka,rabbitmq"


@dataclass
class Stage:
    base: str
    name: str | None
    instructions: list[tuple[str, str]] = field(default_factory=list)

    def args(self, instruction: str) -> list[str]:
        return [args for name, args in self.instructions if name == instruction]

    def run(self) -> str:
        return "\n".join(self.args("RUN"))


def parse(text: str) -> list[Stage]:
    lines: list[str] = []
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if line.startswith("#") or (not line and not pending):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        lines.append(pending + line)
        pending = ""
    assert not pending, "the Dockerfile ends inside a continued line"
    stages: list[Stage] = []
    for line in lines:
        instruction, _, args = line.partition(" ")
        instruction = instruction.upper()
        if instruction == "FROM":
            words = args.split()
            name = words[2] if len(words) == 3 and words[1].upper() == "AS" else None
            stages.append(Stage(base=words[0], name=name))
        else:
            assert stages, f"{instruction} before the first FROM"
            stages[-1].instructions.append((instruction, " ".join(args.split())))
    return stages


@pytest.fixture(scope="module")
def text() -> str:
    return DOCKERFILE.read_text(encoding="utf-8")


@pytest.fixture(scope="module")
def stages(text: str) -> list[Stage]:
    return parse(text)


def stage(stages: list[Stage], name: str) -> Stage:
    found = [s for s in stages if s.name == name]
    assert len(found) == 1, f"expected one stage {name!r}"
    return found[0]


@pytest.fixture(scope="module")
def runtime(stages: list[Stage]) -> Stage:
    """The service image (`bridge run`), which a plain `docker build .` makes."""
    return stage(stages, "service")


@pytest.fixture(scope="module")
def spark(stages: list[Stage]) -> Stage:
    return stage(stages, "spark")


def test_multi_stage_on_python_311_slim(stages: list[Stage]) -> None:
    assert len(stages) >= 2
    assert stages[0].name == "builder"
    # Every stage starts from python:3.11-slim, or from a stage above it.
    for i, s in enumerate(stages):
        assert s.base == "python:3.11-slim" or s.base in {p.name for p in stages[:i]}, s.base


def test_a_plain_build_makes_the_service_image(stages: list[Stage], runtime: Stage) -> None:
    # `docker build .` builds the last stage: the service image as it is, without Spark.
    assert stages[-1].base == "service" and stages[-1].instructions == []
    assert runtime.base == "python:3.11-slim"
    assert "spark" not in runtime.run() and "jre" not in runtime.run()


def test_the_spark_target_adds_java_and_pyspark_to_the_service_image(
    stages: list[Stage], spark: Stage
) -> None:
    assert spark.base == "service"
    wheels = stage(stages, "spark-wheels")
    assert wheels.base == "builder"
    assert re.search(rf'pip wheel --wheel-dir /wheels "?\.\[{EXTRAS},spark\]"?', wheels.run())
    assert "default-jre-headless" in spark.run() and "--no-install-recommends" in spark.run()
    assert "rm -rf /var/lib/apt/lists/*" in spark.run()
    install = next(r for r in spark.args("RUN") if "pip install" in r)
    assert "from=spark-wheels" in install and "--no-index" in install
    assert f"bridge[{EXTRAS},spark]" in install
    # Root only to install; the image runs as the service image does.
    names = [name for name, _ in spark.instructions]
    assert spark.args("USER")[-1] == "10001"
    assert "RUN" not in names[len(names) - 1 - names[::-1].index("USER") :]


def test_the_chart_runs_migrate_on_the_spark_target(text: str) -> None:
    values = yaml.safe_load((ROOT / "helm" / "bridge" / "values.yaml").read_text())
    assert "docker build --target spark" in text
    assert "--target spark" in (ROOT / "helm" / "bridge" / "values.yaml").read_text()
    assert values["migrate"]["image"] == {"repository": "", "tag": ""}  # <tag>-spark


def test_builder_makes_wheels_with_every_transport(stages: list[Stage]) -> None:
    builder = stages[0]
    copied = " ".join(builder.args("COPY"))
    assert "pyproject.toml" in copied and "bridge" in copied
    assert re.search(rf'pip wheel --wheel-dir /wheels "?\.\[{EXTRAS}\]"?', builder.run())


def test_runtime_installs_unixodbc_and_registers_freetds(runtime: Stage) -> None:
    run = runtime.run()
    install = re.search(r"apt-get install ([^&]*)", run)
    assert install, "no apt-get install in the runtime stage"
    packages = install.group(1).split()
    assert {"unixodbc", "tdsodbc"} <= set(packages)
    assert "--no-install-recommends" in packages
    assert "odbcinst -i -d -f /usr/share/tdsodbc/odbcinst.ini" in run
    assert "rm -rf /var/lib/apt/lists/*" in run


def test_runtime_installs_only_the_built_wheels(runtime: Stage) -> None:
    install = next(r for r in runtime.args("RUN") if "pip install" in r)
    assert "from=builder" in install
    assert "--no-cache-dir" in install
    assert "--no-index" in install and "/wheels" in install
    assert f"bridge[{EXTRAS}]" in install


def test_runs_as_non_root_user_10001(runtime: Stage) -> None:
    adduser = next(r for r in runtime.args("RUN") if "useradd" in r)
    assert "--uid 10001" in adduser
    assert "--no-create-home" in adduser
    assert "--shell /usr/sbin/nologin" in adduser
    names = [name for name, _ in runtime.instructions]
    # Numeric, so Kubernetes' runAsNonRoot can verify it; nothing runs as root after it.
    assert runtime.args("USER") == ["10001"]
    assert "RUN" not in names[names.index("USER") :]


def test_entrypoint_is_bridge_and_cmd_runs_the_mounted_routes(runtime: Stage) -> None:
    assert [json.loads(a) for a in runtime.args("ENTRYPOINT")] == [["bridge"]]
    assert [json.loads(a) for a in runtime.args("CMD")] == [
        ["run", "-c", "/etc/bridge/routes.yaml"]
    ]
    assert runtime.args("WORKDIR") == ["/app"]
    assert runtime.args("EXPOSE") == ["8080"]


def test_python_neither_buffers_nor_writes_bytecode(runtime: Stage) -> None:
    env: dict[str, str] = {}
    for args in runtime.args("ENV"):
        for word in shlex.split(args):
            key, _, value = word.partition("=")
            env[key] = value
    assert env["PYTHONDONTWRITEBYTECODE"] == "1"
    assert env["PYTHONUNBUFFERED"] == "1"


def test_documents_microsofts_odbc_driver_as_the_alternative(text: str) -> None:
    assert "ODBC Driver 18 for SQL Server" in text
    assert "msodbcsql18" in text


def test_image_matches_what_the_chart_expects(runtime: Stage) -> None:
    values = yaml.safe_load((ROOT / "helm" / "bridge" / "values.yaml").read_text())
    assert runtime.args("EXPOSE") == [str(values["routes"]["http"]["port"])]
    templates = ROOT / "helm" / "bridge" / "templates"
    deployment = (templates / "deployment.yaml").read_text()
    assert "runAsUser: 10001" in (templates / "_helpers.tpl").read_text()
    assert "- /etc/bridge/routes.yaml" in deployment


def test_dockerignore_keeps_the_context_small_but_complete(stages: list[Stage]) -> None:
    patterns = [
        line.strip()
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    for excluded in (".venv", ".git", "tests", "bench", "*.db", ".pytest_cache", ".mypy_cache"):
        assert excluded in patterns
    assert "**/__pycache__" in patterns
    # Nothing the builder copies may be ignored.
    for args in stages[0].args("COPY"):
        for source in args.split()[:-1]:
            assert not [p for p in patterns if fnmatch.fnmatch(source, p.removeprefix("**/"))]
