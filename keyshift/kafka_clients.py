"""How every Kafka client of keyshift connects: the security options, in one place.

The broker takes SASL/PLAIN logins when `Settings.kafka_sasl_username` and `kafka_sasl_password`
are both set (`KEYSHIFT_KAFKA_SASL_USERNAME`, `KEYSHIFT_KAFKA_SASL_PASSWORD`); otherwise it speaks
PLAINTEXT on loopback. Two functions give a client what it needs either way:

* `client_options(settings)`: keyword arguments for kafka-python's `KafkaProducer`,
  `KafkaConsumer` and `KafkaAdminClient` (`{}` when SASL is off);
* `spark_options(settings)`: options for Spark's Kafka source and sink
  (`.option(key, value)`; `{}` when SASL is off).

Spread them into every construction: `KafkaProducer(bootstrap_servers=..., **client_options(s))`,
`spark.readStream.format("kafka").options(**spark_options(s))`. SASL_PLAINTEXT sends the password
unencrypted: it keeps other local users and processes out, not a network eavesdropper (use
SASL_SSL beyond one host).
"""

from __future__ import annotations

from keyshift.errors import ConfigurationError
from keyshift.settings import Settings

SECURITY_PROTOCOL = "SASL_PLAINTEXT"
"""The protocol of the broker's client listener when SASL is on."""
SASL_MECHANISM = "PLAIN"
"""The SASL mechanism: a user name and a password, checked against the broker's JAAS config."""
PLAIN_LOGIN_MODULE = "org.apache.kafka.common.security.plain.PlainLoginModule"
"""The JAAS login module of SASL/PLAIN, on the broker and in Java clients (Spark's)."""


def sasl_credentials(settings: Settings) -> tuple[str, str] | None:
    """(username, password) of SASL/PLAIN when it is on, None when off.

    Raises:
        ConfigurationError: when only one of the two is set.
    """
    username, password = settings.kafka_sasl_username, settings.kafka_sasl_password
    if bool(username) != (password is not None):
        missing = "KEYSHIFT_KAFKA_SASL_PASSWORD" if username else "KEYSHIFT_KAFKA_SASL_USERNAME"
        raise ConfigurationError(
            f"Kafka SASL/PLAIN needs both a user name and a password; set {missing} too, "
            "or unset both to use PLAINTEXT"
        )
    if username is None or password is None:
        return None
    return username, password.get_secret_value()


def jaas_value(text: str, what: str) -> str:
    """`text` as a double-quoted JAAS option value.

    JAAS option values are quoted strings without an escape for the quote itself, so a value
    holding `"`, a backslash or a control character is refused rather than mangled.

    Raises:
        ConfigurationError: for such a value (`what` names the setting in the message).
    """
    if not text or any(c in text for c in '"\\') or any(ord(c) < 32 or ord(c) == 127 for c in text):
        raise ConfigurationError(
            f"{what} must be non-empty and hold no double quote, backslash or control character"
        )
    return f'"{text}"'


def jaas_config(settings: Settings) -> str | None:
    """The `sasl.jaas.config` of a Java client (Spark's Kafka connector), or None when SASL is off.

    `org.apache.kafka.common.security.plain.PlainLoginModule required username="u" password="p";`

    Raises:
        ConfigurationError: for half-set credentials or a value JAAS cannot quote.
    """
    credentials = sasl_credentials(settings)
    if credentials is None:
        return None
    username, password = credentials
    user = jaas_value(username, "KEYSHIFT_KAFKA_SASL_USERNAME")
    secret = jaas_value(password, "KEYSHIFT_KAFKA_SASL_PASSWORD")
    return f"{PLAIN_LOGIN_MODULE} required username={user} password={secret};"


def client_options(settings: Settings) -> dict[str, str]:
    """kafka-python security options for `KafkaProducer`, `KafkaConsumer`, `KafkaAdminClient`.

    Returns:
        `{}` when SASL is off; else `security_protocol` ("SASL_PLAINTEXT"), `sasl_mechanism`
        ("PLAIN"), `sasl_plain_username` and `sasl_plain_password`.

    Raises:
        ConfigurationError: when only one of the user name and the password is set.
    """
    credentials = sasl_credentials(settings)
    if credentials is None:
        return {}
    username, password = credentials
    return {
        "security_protocol": SECURITY_PROTOCOL,
        "sasl_mechanism": SASL_MECHANISM,
        "sasl_plain_username": username,
        "sasl_plain_password": password,
    }


def spark_options(settings: Settings) -> dict[str, str]:
    """Security options for Spark's Kafka source and sink (`kafka.`-prefixed consumer/producer configs).

    Returns:
        `{}` when SASL is off; else `kafka.security.protocol` ("SASL_PLAINTEXT"),
        `kafka.sasl.mechanism` ("PLAIN") and `kafka.sasl.jaas.config` (see `jaas_config`).

    Raises:
        ConfigurationError: for half-set credentials or a value JAAS cannot quote.
    """
    jaas = jaas_config(settings)
    if jaas is None:
        return {}
    return {
        "kafka.security.protocol": SECURITY_PROTOCOL,
        "kafka.sasl.mechanism": SASL_MECHANISM,
        "kafka.sasl.jaas.config": jaas,
    }
