"""The project's runtime image without Docker: the Dockerfile on a local stand-in for its base.

    fenced-k8s-repro image                       # kind stage  -> out/image/fenced-k8s-executor-dev.tar
                                                 # (first the wheel the Dockerfile copies: dist/, from a clean copy)
    fenced-k8s-repro image --target runtime      # runtime stage -> out/image/fenced-k8s-executor-runtime.tar
    fenced-k8s-repro image --postgres            # -> out/image/postgres-15.tar (localhost/fenced/postgres:15)
    fenced-k8s-repro image --with-postgres       # both: the kind image, then the PostgreSQL image
    python -m fenced_k8s_lab.image ...  # the same
    ... --load                                   # then ../shared/node/load-image.sh on the tar

Needs root, `debootstrap` and `tar` on a Debian host, HTTP access to the Debian mirror of the host's
apt sources and to the package index pip uses, and `../shared/node/mkimage.py` next to the repo
(or $FENCED_MKIMAGE / --mkimage). No Docker daemon, no registry.

Why a stand-in
--------------
The Dockerfile builds `FROM apache/airflow:3.3.2`, which cannot be pulled here (no registry, no
Docker). The Dockerfile stays the single source of truth: this package builds a *stand-in* for
that base locally and then interprets the Dockerfile's own instructions on it (dockerfile.py:
ARG, FROM ... AS, USER, COPY --chown from the context honouring .dockerignore, COPY heredoc, RUN
in shell form; anything else fails loudly naming the instruction). The result is packed by
mkimage.py as a one-layer `docker save` tar.

The stand-in (base.py) is *not* apache/airflow:3.3.2. It is:
  - Debian bookworm, `debootstrap --variant=minbase`, plus bash, ca-certificates, dumb-init,
    python3, python3-venv. Python is Debian's 3.11, as in the Dockerfile's base
    apache/airflow:3.3.2-python3.11 (the official image's default Python is 3.12);
  - user `airflow`, UID 50000, GID 0, HOME /home/airflow; AIRFLOW_HOME=/opt/airflow owned by
    airflow:0 with dags/ and logs/; a virtualenv at ~airflow/.local whose bin is first on PATH
    (like the official 3.x image) holding `apache-airflow[cncf.kubernetes,postgres]==3.3.2`;
  - constrained by the project's `.ci/constraints.txt` (pins resolved for 3.3.2 on Python 3.11),
    NOT Airflow's published constraints-3.3.2 file (GitHub is not reachable from this machine).
    Packages the file does not pin (apache-airflow-providers-postgres and its asyncpg) resolve
    freely within Airflow's own bounds; the official image also carries many more providers;
  - `/entrypoint` (a subset of the official entrypoint_prod.sh, text in base.py): `umask 0002`;
    `bash ...` / `python ...` run as is, `airflow ...` and anything else run as `airflow ...`;
    unless the command is bash/python it waits for the metadata DB with `airflow db check`, up to
    $CONNECTION_CHECK_MAX_COUNT tries (default 20, 0 = off) $CONNECTION_CHECK_SLEEP_TIME apart
    (default 3). Not reproduced: adding an arbitrary UID to /etc/passwd, _PIP_ADDITIONAL_REQUIREMENTS,
    _AIRFLOW_DB_MIGRATE/_AIRFLOW_WWW_USER_CREATE, the Celery broker wait, gosu/tini details;
  - image config: Entrypoint dumb-init + /entrypoint, Cmd [], User 50000, WorkingDir /opt/airflow,
    env AIRFLOW_HOME, AIRFLOW_USER_HOME_DIR, AIRFLOW_UID, PATH, PYTHONUNBUFFERED=1, LANG/LC_ALL=C.UTF-8.
    The Entrypoint is stored as ["/usr/bin/dumb-init", "/entrypoint"] (mkimage.py's argument parser
    cannot take a literal "--"; dumb-init stops parsing its options at the first non-option, so it
    behaves the same as the official ["/usr/bin/dumb-init", "--", "/entrypoint"]).
    The final image's User is the Dockerfile's `USER airflow` (as docker would store it).

Caching: the Debian base and the Airflow stand-in are tars under
${FENCED_IMAGE_CACHE:-${XDG_CACHE_HOME:-~/.cache}/fenced-k8s-executor/image}, named by a hash of
their recipe (packages, Airflow version, extras, the constraints file's text, the entrypoint); a
rebuild only unpacks the stand-in and replays the Dockerfile. Delete the files to start over.

Build hygiene: every command in the rootfs runs through chroot in a private mount namespace of its
own (chroot.py): /proc, /dev, /etc/resolv.conf, the host's CA bundle (bound read-only over the
rootfs's bundle, so pip trusts what the host's pip trusts) and a shared pip download cache exist
for that command only and cannot outlive it or show on the host. Build steps also get the host's
PIP_INDEX_URL/PIP_CERT/proxy settings in their env; the image config does not.

The PostgreSQL image (`--postgres`, localhost/fenced/postgres:15): Debian's postgresql-15 on the
same debootstrap base (without the Airflow layer) and an entrypoint that acts like the official
postgres image's for POSTGRES_USER / POSTGRES_PASSWORD / POSTGRES_DB / POSTGRES_HOST_AUTH_METHOD and
PGDATA (default /var/lib/postgresql/data): started as root it fixes the ownership of PGDATA (an
emptyDir is fine) and drops to postgres (setpriv instead of gosu), runs initdb on first start with
scram-sha-256 for host connections from anywhere, listens on *:5432, and runs postgres in the
foreground, turning SIGTERM into a fast shutdown.

With Docker (the real thing, same Dockerfile):

    pip wheel --no-deps . -w dist
    docker build --target kind -t localhost/fenced-k8s-executor:dev .
    docker save localhost/fenced-k8s-executor:dev -o out/image/fenced-k8s-executor-dev.tar
"""

from fenced_k8s_lab.image.build import main

__all__ = ["main"]
