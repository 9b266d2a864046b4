# ferry's container image: the `ferry` command (name server, broker, exporter,
# RocketMQ 5 proxy).
#   docker build -t ferry:0.1.0 .                     # name server, brokers, exporter, proxy
#   docker build --target analytics -t ferry-analytics:0.1.0 .   # + PySpark and Java for the Spark job
# Build stage: generate the gRPC code and build wheels (ferry's, its dependencies' and
# its `spark` extra's); nothing of it but the wheels reaches the final image (no
# compilers, no grpcio-tools). The code is
# generated as `make proto` does: ferry.v1 from proto/, and apache.rocketmq.v2
# (the proxy's API) from its own directory, its imports made package imports.
FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY proto ./proto
COPY ferry ./ferry
COPY services ./services
COPY apache ./apache
RUN python -m pip install --no-cache-dir "grpcio-tools==1.85.1" \
 && rm -f ferry/v1/*_pb2*.py* apache/rocketmq/v2/*_pb2*.py* \
 && python -m grpc_tools.protoc -I proto --python_out=. --grpc_python_out=. \
      proto/ferry/v1/*.proto \
 && python -m grpc_tools.protoc -I proto/apache/rocketmq/v2 \
      --python_out=apache/rocketmq/v2 --grpc_python_out=apache/rocketmq/v2 \
      proto/apache/rocketmq/v2/*.proto \
 && sed -i 's/^import \([a-z0-9_]*_pb2\) as /from apache.rocketmq.v2 import \1 as /' \
      apache/rocketmq/v2/*_pb2*.py \
 && python -m pip wheel --no-cache-dir --wheel-dir /wheels '.[spark]'

# ferry_native (native/, Rust: the RocketMQ-protocol hot path) as a wheel, built
# with the official Rust image's toolchain (it needs cargo 1.85+). The wheel is
# abi3 (CPython 3.11 and later), so the image's own Python builds it.
FROM rust:1.95-slim AS native
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 python3-venv \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY native ./native
RUN python3 -m venv /venv \
 && /venv/bin/pip wheel --no-cache-dir --wheel-dir /wheels ./native

FROM python:3.11-slim AS runtime
# A fixed non-root user; the store (and the exporter's spool) are the only
# writable paths, mounted as volumes: the root filesystem can be read-only.
RUN groupadd --gid 10001 ferry \
 && useradd --uid 10001 --gid ferry --no-create-home --home-dir /nonexistent ferry \
 && mkdir -p /data && chown ferry:ferry /data
# The wheels are mounted, not copied, so no layer keeps them: PySpark's (the `spark`
# extra) reaches the analytics image alone.
RUN --mount=type=bind,from=build,source=/wheels,target=/wheels \
    --mount=type=bind,from=native,source=/wheels,target=/native-wheels \
    python -m pip install --no-cache-dir --no-index --find-links /wheels \
      --find-links /native-wheels ferry ferry-native
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
USER 10001:10001
WORKDIR /data
EXPOSE 9876 9877 10911 10912 10913 8081 8082
ENTRYPOINT ["ferry"]
CMD ["--help"]

# The Spark job needs PySpark (ferry's `spark` extra) and a Java runtime (PySpark 4 on Java 17).
FROM runtime AS analytics
USER root
RUN apt-get update \
 && apt-get install -y --no-install-recommends openjdk-17-jre-headless \
 && rm -rf /var/lib/apt/lists/*
RUN --mount=type=bind,from=build,source=/wheels,target=/wheels \
    python -m pip install --no-cache-dir --no-index --find-links /wheels 'ferry[spark]'
USER 10001:10001
ENV SPARK_LOCAL_IP=127.0.0.1
