"""Cheat (network): opens a TCP connection to a port on 127.0.0.1 (the test listens there)."""
import socket

PORT = 0  # the test writes the port it listens on


def run(inputs, out):
    s = socket.create_connection(("127.0.0.1", PORT), timeout=2)
    s.sendall(b"escaped")
