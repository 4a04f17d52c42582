# syntax=docker/dockerfile:1
# The topolvm image, for those who build with Docker: `docker build -t topolvm .`
#
# `make image` (devtools/image.py) builds the same image without a Docker daemon, reproducibly,
# from Debian's packages and PyPI; see docs/image.md. Keep the two in step: the runtime
# packages below are devtools/image_recipe.py's DEBIAN_PACKAGES, the Python pins come from that file,
# and tests/test_image.py checks that the lists, paths and entrypoint agree.
ARG DEBIAN_IMAGE=debian:bookworm-slim

FROM ${DEBIAN_IMAGE} AS build
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 python3-venv \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY pyproject.toml hatch_build.py README.md ./
COPY src ./src
COPY devtools/image_recipe.py ./devtools/image_recipe.py
# The pinned runtime dependencies, then this project, its wheel built with pinned tools too.
RUN python3 devtools/image_recipe.py --requirements > /tmp/requirements.txt \
 && python3 devtools/image_recipe.py --build-constraints > /tmp/build-constraints.txt \
 && python3 -m venv /opt/topolvm \
 && PIP_CONSTRAINT=/tmp/build-constraints.txt \
    /opt/topolvm/bin/pip install --no-cache-dir --disable-pip-version-check --no-deps \
      -r /tmp/requirements.txt . \
 && /opt/topolvm/bin/pip check \
 && /opt/topolvm/bin/pip uninstall -y -q pip setuptools

FROM ${DEBIAN_IMAGE}
# devtools/image_recipe.py DEBIAN_PACKAGES
RUN apt-get update \
 && apt-get install -y --no-install-recommends \
      python3 \
      lvm2 \
      xfsprogs \
      e2fsprogs \
      btrfs-progs \
      util-linux \
      mount \
      file \
      thin-provisioning-tools \
 && rm -rf /var/lib/apt/lists/*
COPY --from=build /opt/topolvm /opt/topolvm
# `topolvm` on PATH, and upstream's component names (topolvm dispatches on argv[0]).
RUN ln -s /opt/topolvm/bin/topolvm /usr/local/bin/topolvm \
 && for name in lvmd topolvm-node topolvm-controller topolvm-scheduler; do \
      ln -s /usr/local/bin/topolvm "/$name"; \
    done
ENV PATH=/opt/topolvm/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    LANG=C.UTF-8
LABEL org.opencontainers.image.title="topolvm" \
      org.opencontainers.image.description="TopoLVM (Python): CSI driver for node-local LVM" \
      org.opencontainers.image.licenses="Apache-2.0"
ENTRYPOINT ["topolvm"]
