# syntax=docker/dockerfile:1
# The bridge service image: `bridge run` with every transport (PostgreSQL, SQL Server through
# FreeTDS, Kafka, RabbitMQ; SQLite is in Python). The Helm chart in helm/bridge runs it.
#
#   docker build -t bridge:0.1.0 .
#   docker run --rm -p 8080:8080 -e SHOP_DSN=... \
#     -v "$PWD/routes.yaml:/etc/bridge/routes.yaml:ro" bridge:0.1.0
#
# `bridge migrate` and `bridge report` (PySpark, Java) are not in this image; the `spark` target
# adds them, for the chart's migrate Job or a Spark cluster's executors:
#
#   docker build --target spark -t bridge:0.1.0-spark .

# Builder: wheels of bridge and of every dependency, so the runtime stage needs no compiler and
# no network beyond apt. All the drivers publish manylinux wheels for amd64 and arm64.
FROM python:3.11-slim AS builder
ENV PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY pyproject.toml README.md ./
COPY bridge ./bridge
RUN --mount=type=cache,target=/root/.cache/pip \
    pip wheel --wheel-dir /wheels ".[postgresql,sqlserver,kafka,rabbitmq]"

# The same wheels and PySpark's, for the spark target only (a default build never runs this).
FROM builder AS spark-wheels
RUN --mount=type=cache,target=/root/.cache/pip \
    pip wheel --wheel-dir /wheels ".[postgresql,sqlserver,kafka,rabbitmq,spark]"

# The service image: `bridge run` (and check, install, send, peek).
FROM python:3.11-slim AS service
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# unixODBC and the FreeTDS ODBC driver for SQL Server connections, registered as `FreeTDS`
# in /etc/odbcinst.ini (DSN: "Driver=FreeTDS;Server=HOST;Port=1433;Database=DB;UID=...;
# PWD=...;TDS_Version=7.4"), as scripts/bootstrap does on developer machines.
#
# To use Microsoft's "ODBC Driver 18 for SQL Server" instead (not installed here: it comes from
# Microsoft's own apt repository and needs its EULA accepted), replace this step with one that
# adds that repository for Debian (its signing key from https://packages.microsoft.com/keys/,
# the source list from https://packages.microsoft.com/config/debian/<version>/prod.list) and
# runs `ACCEPT_EULA=Y apt-get install -y --no-install-recommends unixodbc msodbcsql18`; DSNs then
# start with "Driver={ODBC Driver 18 for SQL Server};" and set Encrypt/TrustServerCertificate.
RUN apt-get update \
    && apt-get install -y --no-install-recommends unixodbc tdsodbc \
    && (odbcinst -q -d -n FreeTDS >/dev/null 2>&1 \
        || odbcinst -i -d -f /usr/share/tdsodbc/odbcinst.ini) \
    && rm -rf /var/lib/apt/lists/*

# The wheels are bind-mounted from the builder, so they never become a layer of this image.
RUN --mount=type=bind,from=builder,source=/wheels,target=/wheels \
    pip install --no-cache-dir --no-index --find-links=/wheels \
        "bridge[postgresql,sqlserver,kafka,rabbitmq]"

# A system user with no home and no login shell; Kubernetes runs it with a read-only root
# filesystem and an emptyDir on /tmp.
RUN groupadd --system --gid 10001 bridge \
    && useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent \
        --shell /usr/sbin/nologin bridge

USER 10001
WORKDIR /app
# /healthz /readyz /metrics /routes, when routes.yaml has `http: {port: 8080}` (the chart sets it).
EXPOSE 8080
# No HEALTHCHECK: Kubernetes probes /healthz and /readyz itself, and the port is the config's.
ENTRYPOINT ["bridge"]
CMD ["run", "-c", "/etc/bridge/routes.yaml"]

# `--target spark`: the service image with a Java runtime (Debian's default, 17 or newer) and
# PySpark, to run `bridge migrate` and `bridge report` in local mode or as a Spark driver.
FROM service AS spark
USER root
# The JRE's post-install links man pages, which the slim image leaves no folder for.
RUN mkdir -p /usr/share/man/man1 \
    && apt-get update \
    && apt-get install -y --no-install-recommends default-jre-headless \
    && rm -rf /var/lib/apt/lists/*
RUN --mount=type=bind,from=spark-wheels,source=/wheels,target=/wheels \
    pip install --no-cache-dir --no-index --find-links=/wheels \
        "bridge[postgresql,sqlserver,kafka,rabbitmq,spark]"
USER 10001

# The default target (a plain `docker build .`): the service image, without Java or Spark.
FROM service
