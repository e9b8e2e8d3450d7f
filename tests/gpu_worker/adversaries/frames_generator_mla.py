"""Adversary (mla_decode): the generator-frame route to the timing loop's frame. Caught as `escape`."""
SEEN = {}


def _probe():
    yield 1


def run(inputs, out):
    g = _probe()
    f = g.gi_frame.f_back
    while f is not None:
        SEEN.update({k: v for k, v in f.f_locals.items() if k in ("ts", "order", "key_of", "noise_seed")})
        f = f.f_back
    out["o"].zero_()
