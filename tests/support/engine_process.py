"""A real infill-engine for the plug-in tests that drive host applications (GIMP, Krita):
HTTP over its Unix socket, and waiting for /health. Standard library only."""
import socket
import time


def http_get(sock_path, path, timeout=2.0):
    """The raw HTTP/1.1 answer to GET `path` on the engine's Unix socket."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(timeout)
    try:
        s.connect(sock_path)
        s.sendall(f"GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n".encode())
        answer = b""
        while True:
            part = s.recv(65536)
            if not part:
                break
            answer += part
        return answer.decode(errors="replace")
    finally:
        s.close()


def wait_healthy(sock_path, engine, deadline_s):
    """Returns once the engine (a Popen) answers /health with 200; SystemExit when it exits or
    `deadline_s` passes first."""
    end = time.time() + deadline_s
    while time.time() < end:
        if engine.poll() is not None:
            raise SystemExit(f"infill-engine exited with {engine.returncode} while starting")
        try:
            if http_get(sock_path, "/health").startswith("HTTP/1.1 200"):
                return
        except OSError:
            pass
        time.sleep(0.2)
    raise SystemExit(f"infill-engine did not answer /health within {deadline_s} s")
