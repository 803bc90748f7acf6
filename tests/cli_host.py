"""`bert-train` commands run by one long-lived process, for tests that run many of them.

A fresh `bert-train` process pays TensorFlow's start-up (about 4.5 CPU seconds) and converts
every traced function anew; a test that runs twenty commands in a shell script paid that
twenty times. `CliHost` starts one host process that imports the CLI once and serves
commands one at a time, and puts a `bert-train` executable first on PATH that forwards its
command line, working directory, environment and its own stdin, stdout and stderr (the file
descriptors themselves, passed over a Unix socket) to the host, then exits with the command's
exit code. Pipes (`echo ... | bert-train predict`), `$(...)` and redirections work as with the
console script.

What runs is the console script's own entry point, `bert_trainer.cli.main`. Between commands
the host clears what a fresh process would not have: gin bindings, Keras' session and its
global dtype policy, the environment, the working directory, SIGTERM's handler. What it cannot
clear is a process-wide TensorFlow setting made once (logical devices): tests of those, and of
the console script itself (tests/cli/test_install.py), run real processes.

    host = CliHost(tmp_dir)         # starts the host
    done = host.run(["bash", "-c", script], cwd=root)  # a CompletedProcess, text output
    host.close()

`run` sends output to files, not pipes: a process a command starts and leaves running
(multiprocessing's forkserver) keeps the command's descriptors, and a reader of a pipe
would wait for it to end.
"""

import array
import json
import os
import signal
import socket
import subprocess
import sys

TESTS = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(TESTS)
SOCKET_ENV = "BERT_TRAIN_TEST_HOST"

# The forwarding `bert-train`: starts in ~30 ms (no TensorFlow), exits with the command's code.
SHIM = """#!{python}
import sys
sys.path.insert(0, {tests!r})
import cli_host
sys.exit(cli_host.forward(sys.argv))
"""


class CliHost:
    """A host process serving `bert-train` commands, and the PATH that reaches it.

    Args:
      directory: where the socket, the forwarding executable and the host's log go.
    """

    def __init__(self, directory: str):
        self.directory = directory
        self.socket_path = os.path.join(directory, "host.sock")
        self.bin_dir = os.path.join(directory, "bin")
        os.makedirs(self.bin_dir, exist_ok=True)
        shim = os.path.join(self.bin_dir, "bert-train")
        with open(shim, "w", encoding="utf-8") as f:
            f.write(SHIM.format(python=sys.executable, tests=TESTS))
        os.chmod(shim, 0o755)
        self.log_path = os.path.join(directory, "host.log")
        with open(self.log_path, "w") as log:
            self.process = subprocess.Popen(
                [sys.executable, os.path.abspath(__file__), self.socket_path],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2",
                         PYTHONPATH=os.pathsep.join([TESTS, REPO])))

    def env(self, base: dict) -> dict:
        """`base` with the forwarding `bert-train` first on PATH (and this interpreter's bin)."""
        path = os.pathsep.join([self.bin_dir, os.path.dirname(sys.executable), base["PATH"]])
        return dict(base, PATH=path, **{SOCKET_ENV: self.socket_path})

    def run(self, args: list[str], cwd, timeout: float = 1800,
            **env) -> subprocess.CompletedProcess:
        """Runs `args` (e.g. a bash script) with this host's `bert-train` first on PATH."""
        out_path, err_path = (os.path.join(self.directory, name) for name in ("out", "err"))
        with open(out_path, "w") as out, open(err_path, "w") as err:
            done = subprocess.run(args, cwd=cwd, stdin=subprocess.DEVNULL, stdout=out,
                                  stderr=err, timeout=timeout,
                                  env=self.env(dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", **env)))
        with open(out_path, encoding="utf-8", errors="replace") as out, \
                open(err_path, encoding="utf-8", errors="replace") as err:
            return subprocess.CompletedProcess(args, done.returncode, out.read(), err.read())

    def close(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


# ------------------------------------------------------------------------- the forwarder

def forward(argv: list[str]) -> int:
    """Runs `bert-train argv[1:]` in the host; returns its exit code."""
    path = os.environ[SOCKET_ENV]
    client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    for _ in range(1200):  # the host may still be importing TensorFlow: up to 2 minutes
        try:
            client.connect(path)
            break
        except (FileNotFoundError, ConnectionRefusedError):
            import time  # noqa: PLC0415

            time.sleep(0.1)
    else:
        print(f"bert-train (test host): no host at {path}", file=sys.stderr)
        return 70
    request = json.dumps({"argv": ["bert-train", *argv[1:]], "cwd": os.getcwd(),
                          "env": dict(os.environ)}).encode()
    socket.send_fds(client, [len(request).to_bytes(8, "big")], [0, 1, 2])
    client.sendall(request)
    reply = b""
    while chunk := client.recv(64):
        reply += chunk
    return int(reply.decode() or 70)


# ------------------------------------------------------------------------------ the host

def _receive(connection) -> tuple[dict, list[int]]:
    fds = array.array("i")
    header, ancillary, _, _ = connection.recvmsg(8, socket.CMSG_LEN(3 * fds.itemsize))
    for level, kind, data in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(data[: len(data) - len(data) % fds.itemsize])
    size, body = int.from_bytes(header, "big"), b""
    while len(body) < size:
        body += connection.recv(size - len(body))
    return json.loads(body), list(fds)


def _run_one(request: dict, fds: list[int]) -> int:
    """Runs one command with the caller's stdin/stdout/stderr, directory and environment."""
    import gc  # noqa: PLC0415
    import io  # noqa: PLC0415

    import gin  # noqa: PLC0415
    import keras  # noqa: PLC0415

    from bert_trainer import cli  # noqa: PLC0415

    gin.clear_config()
    keras.backend.clear_session()  # collects what the command before left
    # The rest (TensorFlow, what the commands before keep in caches) is frozen, as `cli.main`
    # freezes what a fresh process imported: collections then walk only what this command
    # makes. Walking it all took 0.1 to 0.45 CPU s a command, more with each one.
    gc.freeze()
    keras.config.set_dtype_policy("float32")
    saved = [os.dup(fd) for fd in (0, 1, 2)]
    for fd, theirs in zip((0, 1, 2), fds, strict=True):
        os.dup2(theirs, fd)
        os.close(theirs)
    old_streams = sys.stdin, sys.stdout, sys.stderr
    sys.stdin = io.TextIOWrapper(io.BufferedReader(io.FileIO(0, "r", closefd=False)))
    sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), line_buffering=True)
    sys.stderr = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), line_buffering=True)
    old_env, old_cwd = dict(os.environ), os.getcwd()
    os.environ.clear()
    os.environ.update(request["env"])
    os.chdir(request["cwd"])
    try:
        code = cli.main(request["argv"])
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException:  # noqa: BLE001 - what a fresh process would print before dying
        import traceback  # noqa: PLC0415

        traceback.print_exc()
        code = 1
    finally:
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        sys.stdin, sys.stdout, sys.stderr = old_streams
        os.chdir(old_cwd)
        os.environ.clear()
        os.environ.update(old_env)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        for fd, mine in zip((0, 1, 2), saved, strict=True):
            os.dup2(mine, fd)
            os.close(mine)
    return int(code or 0)


def serve(socket_path: str) -> None:
    from multiprocessing import resource_tracker  # noqa: PLC0415

    import tensorflow  # noqa: F401, PLC0415 (loaded before the first command, as cli.main does)
    import tensorflow_text  # noqa: F401, PLC0415

    # A helper process started during a command that outlives it would keep that command's
    # stdout open (the caller would wait for it forever): multiprocessing's resource
    # tracker is one; started now, it holds the host's own descriptors instead.
    resource_tracker.ensure_running()

    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    staging = socket_path + ".tmp"
    server.bind(staging)
    server.listen(4)
    os.replace(staging, socket_path)  # the forwarder finds only a listening host
    while True:
        connection, _ = server.accept()
        with connection:
            request, fds = _receive(connection)
            code = _run_one(request, fds)
            connection.sendall(str(code).encode())


if __name__ == "__main__":
    serve(sys.argv[1])
