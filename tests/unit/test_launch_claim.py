"""The launch claim minted into the workload JWT: real JWTGenerator / JWTValidator, no mocks."""

from __future__ import annotations

import logging
import uuid

import jwt
import pytest

from fenced_k8s_executor import launch_claim, metrics
from fenced_k8s_executor.names import LAUNCH_CLAIM

SECRET = "unit-test-secret-" + "x" * 64
AUDIENCE = "urn:airflow.apache.org:task"


@pytest.fixture
def generator():
    from airflow.api_fastapi.auth.tokens import JWTGenerator

    return JWTGenerator(secret_key=SECRET, audience=AUDIENCE, valid_for=600, issuer=None, algorithm="HS512", kid="k")


@pytest.fixture
def validator():
    from airflow.api_fastapi.auth.tokens import JWTValidator

    return JWTValidator(
        secret_key=SECRET,
        audience=[AUDIENCE],
        issuer=None,
        required_claims=frozenset({"aud", "exp", "iat"}),
        algorithm=["HS512"],
        leeway=0,
    )


def test_mint_carries_stock_claims_plus_launch_claim(generator, validator):
    ti_id, token = str(uuid.uuid4()), str(uuid.uuid4())
    jwt_token = launch_claim.mint(generator, ti_id=ti_id, token=token, valid_for=321.0)
    claims = validator.validated_claims(jwt_token)
    assert claims["sub"] == ti_id
    assert claims["scope"] == "workload"
    assert claims[LAUNCH_CLAIM] == token
    assert claims["exp"] - claims["iat"] == 321
    assert claims["aud"] == AUDIENCE
    assert launch_claim.launch_claim_of(claims) == token


def test_mint_has_the_stock_token_shape_and_lifetime(generator, validator):
    """Same claim set and lifetime as BaseWorkloadSchema.generate_token, plus one claim."""
    from airflow.configuration import conf
    from airflow.executors.workloads.base import BaseWorkloadSchema

    ti_id, token = str(uuid.uuid4()), str(uuid.uuid4())
    stock = validator.validated_claims(BaseWorkloadSchema.generate_token(ti_id, generator))
    ours = validator.validated_claims(
        launch_claim.mint(generator, ti_id=ti_id, token=token, valid_for=conf.getfloat("scheduler", "task_queued_timeout"))
    )
    assert set(ours) - set(stock) == {LAUNCH_CLAIM}
    assert set(stock) - set(ours) == set()
    assert ours["exp"] - ours["iat"] == stock["exp"] - stock["iat"]
    assert {k: ours[k] for k in ("sub", "scope", "aud")} == {k: stock[k] for k in ("sub", "scope", "aud")}


def test_claim_survives_the_execution_api_claim_model(generator, validator):
    """The execution API's TIClaims model keeps extra claims (extra="allow")."""
    from airflow.api_fastapi.execution_api.datamodels.token import TIClaims

    token = str(uuid.uuid4())
    claims = validator.validated_claims(launch_claim.mint(generator, ti_id=str(uuid.uuid4()), token=token, valid_for=60))
    model = TIClaims(**claims)
    assert model.scope == "workload"
    assert launch_claim.launch_claim_of(model.model_dump()) == token


def test_canonical_token_and_legacy_values(generator):
    token = uuid.uuid4()
    jwt_token = launch_claim.mint(generator, ti_id="x", token=token.hex.upper(), valid_for=60)
    assert launch_claim.launch_claim_of(launch_claim.unverified_claims(jwt_token)) == str(token)
    with pytest.raises(ValueError) as err:
        launch_claim.mint(generator, ti_id="x", token="42", valid_for=60)
    assert "42" not in str(err.value)
    assert launch_claim.mint(None, ti_id="x", token=str(token), valid_for=60) == ""
    assert launch_claim.launch_claim_of({}) is None
    assert launch_claim.launch_claim_of(None) is None
    assert launch_claim.launch_claim_of({LAUNCH_CLAIM: "17"}) is None  # a job id is legacy
    assert launch_claim.launch_claim_of({"sub": str(token)}) is None


def test_unverified_claims_reads_without_the_key(generator):
    token = str(uuid.uuid4())
    jwt_token = launch_claim.mint(generator, ti_id="t", token=token, valid_for=60)
    assert launch_claim.unverified_claims(jwt_token)[LAUNCH_CLAIM] == token
    # a token signed with another key still reads (the worker never verifies)
    forged = jwt.encode({LAUNCH_CLAIM: token}, "other-key-" + "y" * 32, algorithm="HS256")
    assert launch_claim.launch_claim_of(launch_claim.unverified_claims(forged)) == token
    assert launch_claim.unverified_claims("not a jwt") == {}
    assert launch_claim.unverified_claims("") == {}


def test_no_token_or_jwt_in_logs(generator, caplog):
    caplog.set_level(logging.DEBUG)
    ti_id, token = str(uuid.uuid4()), str(uuid.uuid4())
    jwt_token = launch_claim.mint(generator, ti_id=ti_id, token=token, valid_for=60)
    launch_claim.launch_claim_of(launch_claim.unverified_claims(jwt_token))
    metrics.decision("run_gate.rejected", path="run_gate", reason="x", enforced=True,
                     launch=metrics.short(token), current_launch=metrics.short(str(uuid.uuid4())))
    text = caplog.text
    assert token not in text and token.replace("-", "") not in text
    assert jwt_token not in text
    assert metrics.short(token) in text
