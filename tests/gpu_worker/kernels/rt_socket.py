import socket


def run(inputs, out):
    s = socket.socket()
    s.connect(("127.0.0.1", 9))
