"""`gpupack certs` and the serving-cert reload: handshakes run in memory (ssl.MemoryBIO), no sockets."""

from __future__ import annotations

import base64
import ssl
import stat
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID

from app import cli
from app.service import certs
from app.service.tls import ReloadingContext
from webhook import metrics as webhook_metrics
from webhook.metrics import count_cert_reload

DNS = certs.service_dns_names("gpupack-webhook", "gpupack-system")


def handshake(server_ctx: ssl.SSLContext, ca_file: Path, hostname: str = "127.0.0.1") -> x509.Certificate:
    """A full TLS handshake between a verifying client and `server_ctx`; the certificate the server showed.

    With an IP as hostname the client sends no SNI, like the apiserver calling https://127.0.0.1:PORT.
    """
    client_ctx = ssl.create_default_context(cafile=str(ca_file))
    c_in, c_out, s_in, s_out = ssl.MemoryBIO(), ssl.MemoryBIO(), ssl.MemoryBIO(), ssl.MemoryBIO()
    client = client_ctx.wrap_bio(c_in, c_out, server_hostname=hostname)
    server = server_ctx.wrap_bio(s_in, s_out, server_side=True)
    done = {"client": False, "server": False}
    for _ in range(20):
        for name, end in (("client", client), ("server", server)):
            if not done[name]:
                try:
                    end.do_handshake()
                    done[name] = True
                except ssl.SSLWantReadError:
                    pass
        s_in.write(c_out.read())
        c_in.write(s_out.read())
        if all(done.values()):
            der = client.getpeercert(binary_form=True)
            assert der is not None
            return x509.load_der_x509_certificate(der)
    raise AssertionError("handshake did not finish")


METRICS = webhook_metrics.registry()


def reloads(result: str) -> float:
    return METRICS.get_sample_value("gpupack_webhook_cert_reloads_total", {"result": result}) or 0.0


def test_bundle_files_and_cert_fields(tmp_path: Path) -> None:
    bundle = certs.write_bundle(tmp_path, DNS, ["127.0.0.1"], days=30)
    assert base64.b64decode(bundle) == (tmp_path / "ca.crt").read_bytes()
    for key in ("ca.key", "tls.key"):
        assert stat.S_IMODE((tmp_path / key).stat().st_mode) == 0o600
    ca = x509.load_pem_x509_certificate((tmp_path / "ca.crt").read_bytes())
    leaf = x509.load_pem_x509_certificate((tmp_path / "tls.crt").read_bytes())
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca is True
    assert leaf.extensions.get_extension_for_class(x509.BasicConstraints).value.ca is False
    assert leaf.issuer == ca.subject
    sans = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert sans.get_values_for_type(x509.DNSName) == DNS
    assert [str(ip) for ip in sans.get_values_for_type(x509.IPAddress)] == ["127.0.0.1"]
    eku = leaf.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(eku) == [ExtendedKeyUsageOID.SERVER_AUTH]
    lifetime = leaf.not_valid_after_utc - leaf.not_valid_before_utc
    assert 30 * 86400 <= lifetime.total_seconds() <= 30 * 86400 + 600


@pytest.mark.parametrize("hostname", ["127.0.0.1", "gpupack-webhook.gpupack-system.svc"])
def test_cert_verifies_for_each_san(tmp_path: Path, hostname: str) -> None:
    certs.write_bundle(tmp_path, DNS, ["127.0.0.1"])
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(tmp_path / "tls.crt", tmp_path / "tls.key")
    handshake(ctx, tmp_path / "ca.crt", hostname)


def test_cert_is_refused_for_a_name_it_does_not_carry(tmp_path: Path) -> None:
    certs.write_bundle(tmp_path, DNS, [])
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(tmp_path / "tls.crt", tmp_path / "tls.key")
    with pytest.raises(ssl.SSLCertVerificationError):
        handshake(ctx, tmp_path / "ca.crt", "127.0.0.1")


def test_rerun_keeps_the_ca_unless_asked(tmp_path: Path) -> None:
    first = certs.write_bundle(tmp_path, DNS, [])
    leaf = (tmp_path / "tls.crt").read_bytes()
    assert certs.write_bundle(tmp_path, DNS, []) == first
    assert (tmp_path / "tls.crt").read_bytes() != leaf
    assert certs.write_bundle(tmp_path, DNS, [], fresh_ca=True) != first


def test_needs_a_name() -> None:
    with pytest.raises(ValueError, match="at least one DNS name or IP"):
        certs.new_serving_cert(certs.new_ca(), [], [])


def test_cli_prints_only_the_ca_bundle(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc = cli.main(
        ["certs", "--out", str(tmp_path), "--ip", "127.0.0.1", "--dns", "webhook.example", "--days", "2"]
    )
    out, err = capsys.readouterr()
    assert rc == 0
    assert out.strip() == base64.b64encode((tmp_path / "ca.crt").read_bytes()).decode()
    assert "webhook.example" in err and "gpupack-webhook.gpupack-system.svc" in err
    leaf = x509.load_pem_x509_certificate((tmp_path / "tls.crt").read_bytes())
    sans = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "webhook.example" in sans.get_values_for_type(x509.DNSName)


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        pytest.param(["--ip", "notanip"], "--ip='notanip': must be an IPv4 or IPv6 address", id="bad-ip"),
        pytest.param(
            ["--days", "0"], "--days='0': must be a whole number of days from 1 to 3650", id="zero-days"
        ),
        pytest.param(["--days", "1e3"], "--days='1e3': must be a whole number of days", id="exponent-days"),
    ],
)
def test_cli_refuses_bad_flags_with_the_rule(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], flags: list[str], message: str
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["certs", "--out", str(tmp_path), *flags])
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "tls.crt").exists()


def test_rotated_cert_is_served_to_new_connections(tmp_path: Path) -> None:
    certs.write_bundle(tmp_path, DNS, ["127.0.0.1"])
    now = [0.0]
    tls = ReloadingContext(
        tmp_path / "tls.crt",
        tmp_path / "tls.key",
        check_interval=5.0,
        clock=lambda: now[0],
        on_reload=count_cert_reload,
    )
    first = handshake(tls.context, tmp_path / "ca.crt")

    certs.write_bundle(tmp_path, DNS, ["127.0.0.1"])  # same CA, new serving cert
    assert handshake(tls.context, tmp_path / "ca.crt").serial_number == first.serial_number  # not checked yet
    ok_before = reloads("ok")
    now[0] = 5.0
    rotated = handshake(tls.context, tmp_path / "ca.crt")
    assert rotated.serial_number != first.serial_number
    assert (
        rotated.serial_number
        == x509.load_pem_x509_certificate((tmp_path / "tls.crt").read_bytes()).serial_number
    )
    assert (tls.reloads, reloads("ok")) == (1, ok_before + 1)


def test_half_written_rotation_keeps_the_old_cert_then_recovers(tmp_path: Path) -> None:
    certs.write_bundle(tmp_path, DNS, ["127.0.0.1"])
    tls = ReloadingContext(
        tmp_path / "tls.crt", tmp_path / "tls.key", check_interval=0.0, on_reload=count_cert_reload
    )
    first = handshake(tls.context, tmp_path / "ca.crt")
    good_key = (tmp_path / "tls.key").read_bytes()

    # A new cert next to the old key: the pair does not match, so nothing changes.
    failed_before = reloads("failed")
    serving = certs.new_serving_cert(
        certs.Pem((tmp_path / "ca.crt").read_bytes(), (tmp_path / "ca.key").read_bytes()), DNS, ["127.0.0.1"]
    )
    (tmp_path / "tls.crt").write_bytes(serving.cert)
    assert handshake(tls.context, tmp_path / "ca.crt").serial_number == first.serial_number
    assert reloads("failed") > failed_before
    (tmp_path / "tls.key").write_bytes(b"garbage")
    assert handshake(tls.context, tmp_path / "ca.crt").serial_number == first.serial_number

    (tmp_path / "tls.key").write_bytes(serving.key)  # the rotation completes
    recovered = handshake(tls.context, tmp_path / "ca.crt")
    assert recovered.serial_number == x509.load_pem_x509_certificate(serving.cert).serial_number
    assert good_key != serving.key


def test_bad_files_at_start_are_fatal(tmp_path: Path) -> None:
    (tmp_path / "tls.crt").write_text("not a cert")
    (tmp_path / "tls.key").write_text("not a key")
    with pytest.raises(ssl.SSLError):
        ReloadingContext(tmp_path / "tls.crt", tmp_path / "tls.key")
