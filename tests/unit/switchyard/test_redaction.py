"""Secrets in deployments: credential assignments hidden, variable names and references kept."""

from __future__ import annotations

from server.switchyard import redaction


def test_credential_assignments_are_redacted_but_names_and_references_kept():
    text = (
        'api_key = "sk-live"\napi_key_env = "OPENAI_API_KEY"\nextra_headers = { "x-api-token" = "t0k" }\n'
        'other_key = "${SOME_KEY}"\nbase_url = "http://x"\n'
    )
    out = redaction.redact_assignments(text)
    assert "sk-live" not in out and "t0k" not in out
    assert 'api_key_env = "OPENAI_API_KEY"' in out and '"${SOME_KEY}"' in out and 'base_url = "http://x"' in out
    yaml_out = redaction.redact_assignments(
        "a:\n  switchyard_api_key: my secret key\n  other_api_key: ${oc.env:K,dummy}\n", yaml=True
    )
    assert "my secret key" not in yaml_out and "${oc.env:K,dummy}" in yaml_out
