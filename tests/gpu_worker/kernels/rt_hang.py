def run(inputs, out):
    while True:
        pass
