"""Keys and JWTs for tests and the demo, made with the openssl command line (no Python crypto
package needed): RSA and EC P-256 keys, their public JWKs (RFC 7517), and compact JWS tokens
signed RS256, PS256 or ES256 (RFC 7515, RFC 7518 §3)."""
import base64
import json
import os
import subprocess
import tempfile


def b64url(data):
    if isinstance(data, str):
        data = data.encode()
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _run(*args, data=None):
    return subprocess.run(["openssl"] + list(args), input=data, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          check=True, timeout=30).stdout


class Key:
    """A private key in a PEM file under workdir, with its kid and public JWK."""

    def __init__(self, workdir, kid, kind="RSA"):
        self.kid, self.kind = kid, kind
        self.path = os.path.join(workdir, "key-%s.pem" % kid)
        if kind == "RSA":
            _run("genpkey", "-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048", "-out", self.path)
            modulus = _run("rsa", "-in", self.path, "-noout", "-modulus").decode().strip().split("=", 1)[1]
            n = bytes.fromhex(modulus)
            self.jwk = {"kty": "RSA", "kid": kid, "use": "sig", "n": b64url(n), "e": "AQAB"}
            self.pub_pem = _run("rsa", "-in", self.path, "-pubout")
        else:
            _run("genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", self.path)
            der = _run("ec", "-in", self.path, "-pubout", "-outform", "DER")
            point = der[-65:]  # 04 || x || y
            self.jwk = {"kty": "EC", "kid": kid, "use": "sig", "crv": "P-256",
                        "x": b64url(point[1:33]), "y": b64url(point[33:])}
            self.pub_pem = _run("ec", "-in", self.path, "-pubout")

    def sign(self, signing_input, alg):
        if alg == "RS256":
            return _run("dgst", "-sha256", "-sign", self.path, data=signing_input)
        if alg == "PS256":
            return _run("dgst", "-sha256", "-sign", self.path, "-sigopt", "rsa_padding_mode:pss",
                        "-sigopt", "rsa_pss_saltlen:32", data=signing_input)
        if alg == "ES256":
            der = _run("dgst", "-sha256", "-sign", self.path, data=signing_input)
            return _der_to_raw(der, 32)
        raise ValueError(alg)


def _der_to_raw(der, size):
    """An ECDSA signature from DER (SEQUENCE of two INTEGERs) to r || s (RFC 7518 §3.4)."""
    assert der[0] == 0x30
    i = 2 if der[1] < 0x80 else 2 + (der[1] & 0x7F)
    out = b""
    for _ in range(2):
        assert der[i] == 0x02
        n = der[i + 1]
        v = der[i + 2:i + 2 + n].lstrip(b"\0")
        out += v.rjust(size, b"\0")
        i += 2 + n
    return out


def jwks(*keys):
    return {"keys": [k.jwk for k in keys]}


def token(key, claims, alg="RS256", header=None, kid=True):
    """A compact JWS of claims signed by key (header: extra or replacing header members)."""
    h = {"alg": alg, "typ": "JWT"}
    if kid:
        h["kid"] = key.kid
    h.update(header or {})
    signing_input = (b64url(json.dumps(h)) + "." + b64url(json.dumps(claims))).encode()
    return signing_input.decode() + "." + b64url(key.sign(signing_input, alg))


def hs256(secret, claims, header=None):
    """An HS256 token with secret (bytes) as the HMAC key: how an algorithm-confusion attacker
    signs with a public key."""
    import hashlib
    import hmac
    h = {"alg": "HS256", "typ": "JWT"}
    h.update(header or {})
    signing_input = (b64url(json.dumps(h)) + "." + b64url(json.dumps(claims))).encode()
    return signing_input.decode() + "." + b64url(hmac.new(secret, signing_input, hashlib.sha256).digest())


def unsigned(claims, header=None):
    h = {"alg": "none"}
    h.update(header or {})
    return b64url(json.dumps(h)) + "." + b64url(json.dumps(claims)) + "."
