def run(inputs, out):
    with open("/tmp/marathon-escape.txt", "w") as f:
        f.write("x")
