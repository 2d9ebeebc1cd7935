# The example servers (examples/servers) as images, one target each:
# python, node, cpp, built on the local debian:bookworm-slim with no image
# pulled. They hold what examples/servers/setup.sh built on the host (a
# bookworm machine, so the runtime libraries match) plus the Debian
# runtime each needs, installed from the base image's own apt sources.
#
# The build context is a folder `.ci/docker examples` stages:
#   examples/servers/echo.proto
#   examples/servers/python/server.py, examples/servers/site-packages/
#     (the .venv's)
#   examples/servers/node/{server.js,package.json,node_modules/}
#   examples/servers/cpp/build/echo-server
#
# The files keep the repository's layout under /tailmesh, and the working
# directory is /tailmesh/scenarios, so a scenario's [hop.service] command
# written relative to scenarios/ (../examples/servers/...) runs the same in
# the container as `tailmesh run` runs it on the host. HOST=0.0.0.0: the
# sidecar calls the service from another container (Compose).
ARG BASE_IMAGE=debian:bookworm-slim

FROM ${BASE_IMAGE} AS common
ENV HOST=0.0.0.0
WORKDIR /tailmesh/scenarios
COPY examples/servers/echo.proto /tailmesh/examples/servers/echo.proto

FROM common AS python
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 \
 && rm -rf /var/lib/apt/lists/*
# A virtual environment by hand (Debian's python3-venv is not needed):
# pyvenv.cfg beside bin/, whose python is Debian's, and the host's
# site-packages (CPython 3.11 on both).
COPY examples/servers/site-packages /tailmesh/examples/servers/.venv/lib/python3.11/site-packages
RUN mkdir -p /tailmesh/examples/servers/.venv/bin \
 && ln -s /usr/bin/python3 /tailmesh/examples/servers/.venv/bin/python \
 && printf 'home = /usr/bin\ninclude-system-site-packages = false\n' \
      >/tmp/pyvenv.cfg \
 && mv /tmp/pyvenv.cfg /tailmesh/examples/servers/.venv/pyvenv.cfg \
 && /tailmesh/examples/servers/.venv/bin/python -c 'import grpc, grpc_health, grpc_reflection'
COPY examples/servers/python/server.py /tailmesh/examples/servers/python/server.py
CMD ["../examples/servers/.venv/bin/python", "../examples/servers/python/server.py", "--sleep"]

FROM common AS node
RUN apt-get update \
 && apt-get install -y --no-install-recommends nodejs \
 && rm -rf /var/lib/apt/lists/*
COPY examples/servers/node /tailmesh/examples/servers/node
CMD ["node", "../examples/servers/node/server.js", "--sleep"]

FROM common AS cpp
RUN apt-get update \
 && apt-get install -y --no-install-recommends libgrpc++1.51 libprotobuf32 \
 && rm -rf /var/lib/apt/lists/*
COPY examples/servers/cpp/build/echo-server /tailmesh/examples/servers/cpp/build/echo-server
CMD ["../examples/servers/cpp/build/echo-server", "--sleep"]
