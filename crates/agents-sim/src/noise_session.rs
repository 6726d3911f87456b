//! The Noise session of one relay stream: `Noise_hybridIK_25519+MLKEM768_AESGCM_SHA256`
//! (the hybrid IK pattern of the `clatter` crate, which codex uses), the prologue, and the
//! `u32 BE length ‖ JSON-RPC` plaintext framing of the transport records.
//!
//! Source: ../shared/reference/executor-protocol.md, "Registration and rendezvous", 5–6:
//! the harness (the Agents API side, here the simulator) is the initiator and knows the
//! executor's static X25519 and ML-KEM-768 public keys from the registration; the prologue
//! is `"codex-exec-server-relay-noise/v1"`, environment id, registration id and stream id,
//! each preceded by its length as a u64 big-endian; records carry at most 60 KiB of
//! plaintext. Only the pattern glue is written here; the primitives are `clatter`'s.

use clatter::crypto::cipher::AesGcm;
use clatter::crypto::dh::X25519;
use clatter::crypto::hash::Sha256;
use clatter::crypto::kem::rust_crypto_ml_kem::MlKem768;
use clatter::handshakepattern::noise_hybrid_ik;
use clatter::traits::{Dh, Handshaker, Kem};
use clatter::{HybridHandshake, HybridHandshakeParams, KeyPair};

/// The handshake state of one stream.
pub type Handshake = HybridHandshake<X25519, MlKem768, MlKem768, AesGcm, Sha256>;
/// The transport state after the handshake.
pub type Transport = clatter::transportstate::TransportState<AesGcm, Sha256>;

/// The Noise protocol name both sides must build (checked by a test).
pub const PROTOCOL_NAME: &str = "Noise_hybridIK_25519+MLKEM768_AESGCM_SHA256";
/// First prologue part.
pub const PROLOGUE_LABEL: &str = "codex-exec-server-relay-noise/v1";
/// Plaintext bytes per transport record.
pub const MAX_RECORD_PLAINTEXT: usize = 60 * 1024;
/// X25519 public key length, bytes.
pub const X25519_PUBLIC_LEN: usize = 32;
/// ML-KEM-768 encapsulation key length, bytes.
pub const MLKEM768_PUBLIC_LEN: usize = 1184;

type DhPair = KeyPair<<X25519 as Dh>::PubKey, <X25519 as Dh>::PrivateKey>;
type KemPair = KeyPair<<MlKem768 as Kem>::PubKey, <MlKem768 as Kem>::SecretKey>;

/// A static identity: an X25519 key pair and an ML-KEM-768 key pair.
#[derive(Clone)]
pub struct StaticKeys {
    dh: DhPair,
    kem: KemPair,
}

impl StaticKeys {
    /// Fresh random keys.
    ///
    /// # Errors
    /// The crypto provider's error text.
    pub fn generate() -> Result<Self, String> {
        Ok(Self {
            dh: X25519::genkey().map_err(|e| format!("x25519 keygen: {e:?}"))?,
            kem: MlKem768::genkey().map_err(|e| format!("ml-kem keygen: {e:?}"))?,
        })
    }

    /// The X25519 public key (32 bytes).
    #[must_use]
    pub fn x25519_public(&self) -> Vec<u8> {
        self.dh.public.as_slice().to_vec()
    }

    /// The ML-KEM-768 public (encapsulation) key (1184 bytes).
    #[must_use]
    pub fn mlkem_public(&self) -> Vec<u8> {
        use clatter::bytearray::ByteArray as _;
        self.kem.public.as_slice().to_vec()
    }
}

/// The `suite` of a public key in registration and validation bodies (it differs from
/// [`PROTOCOL_NAME`] in spelling `X25519`).
pub const KEY_SUITE: &str = "Noise_hybridIK_X25519+MLKEM768_AESGCM_SHA256";

/// A public key as the registry carries it: `{suite, x25519_public_key,
/// mlkem768_public_key}`, both keys standard base64 (32 and 1184 bytes).
#[must_use]
pub fn public_key_json(x25519: &[u8], mlkem: &[u8]) -> serde_json::Value {
    use base64::Engine as _;
    let b64 = base64::engine::general_purpose::STANDARD;
    serde_json::json!({
        "suite": KEY_SUITE,
        "x25519_public_key": b64.encode(x25519),
        "mlkem768_public_key": b64.encode(mlkem),
    })
}

/// The peer's static public keys (X25519, ML-KEM-768) once a handshake message carrying
/// them was read (the responder after msg1).
#[must_use]
pub fn remote_static(hs: &Handshake) -> Option<(Vec<u8>, Vec<u8>)> {
    use clatter::bytearray::ByteArray as _;
    let pair = hs.get_remote_static()?;
    Some((
        pair.dh().as_slice().to_vec(),
        pair.kem().as_slice().to_vec(),
    ))
}

/// The prologue of a stream: each part preceded by its length as a u64 big-endian.
#[must_use]
pub fn prologue(environment_id: &str, registration_id: &str, stream_id: &str) -> Vec<u8> {
    let mut out = Vec::new();
    for part in [PROLOGUE_LABEL, environment_id, registration_id, stream_id] {
        out.extend_from_slice(&(part.len() as u64).to_be_bytes());
        out.extend_from_slice(part.as_bytes());
    }
    out
}

/// The harness side: initiator, knowing the executor's static keys from its registration.
///
/// # Errors
/// Keys of the wrong length, or `clatter`'s error text.
pub fn initiator(
    own: StaticKeys,
    executor_x25519: &[u8],
    executor_mlkem: &[u8],
    prologue: &[u8],
) -> Result<Handshake, String> {
    use clatter::bytearray::ByteArray as _;
    if executor_x25519.len() != X25519_PUBLIC_LEN || executor_mlkem.len() != MLKEM768_PUBLIC_LEN {
        return Err("executor public keys have the wrong length".to_owned());
    }
    let params = HybridHandshakeParams::new(noise_hybrid_ik(), true)
        .with_prologue(prologue)
        .with_s(own.dh)
        .with_s_kem(own.kem)
        .with_rs(<X25519 as Dh>::PubKey::from_slice(executor_x25519))
        .with_rs_kem(<MlKem768 as Kem>::PubKey::from_slice(executor_mlkem));
    Handshake::new(params).map_err(|e| format!("noise initiator: {e:?}"))
}

/// The executor side: responder, with its static keys.
///
/// # Errors
/// `clatter`'s error text.
pub fn responder(own: StaticKeys, prologue: &[u8]) -> Result<Handshake, String> {
    let params = HybridHandshakeParams::new(noise_hybrid_ik(), false)
        .with_prologue(prologue)
        .with_s(own.dh)
        .with_s_kem(own.kem);
    Handshake::new(params).map_err(|e| format!("noise responder: {e:?}"))
}

/// Writes the next handshake message carrying `payload`.
///
/// # Errors
/// `clatter`'s error text.
pub fn write(hs: &mut Handshake, payload: &[u8]) -> Result<Vec<u8>, String> {
    let mut buf = vec![0u8; 8192 + payload.len()];
    let n = hs
        .write_message(payload, &mut buf)
        .map_err(|e| format!("noise write: {e:?}"))?;
    buf.truncate(n);
    Ok(buf)
}

/// Reads a handshake message, returning its payload.
///
/// # Errors
/// A message that does not decrypt (wrong keys or prologue), or `clatter`'s error text.
pub fn read(hs: &mut Handshake, message: &[u8]) -> Result<Vec<u8>, String> {
    let mut buf = vec![0u8; message.len()];
    let n = hs
        .read_message(message, &mut buf)
        .map_err(|e| format!("noise read: {e:?}"))?;
    buf.truncate(n);
    Ok(buf)
}

/// Ends a finished handshake: the transport state (the initiator sends with the first key).
///
/// # Errors
/// The handshake is not finished, or `clatter`'s error text.
pub fn finish(hs: Handshake) -> Result<Transport, String> {
    hs.finalize().map_err(|e| format!("noise finalize: {e:?}"))
}

/// The plaintext records of one JSON-RPC message: `u32 BE length ‖ message`, cut into
/// pieces of at most [`MAX_RECORD_PLAINTEXT`] bytes.
#[must_use]
pub fn records(message: &[u8]) -> Vec<Vec<u8>> {
    let mut plain = Vec::with_capacity(message.len() + 4);
    plain.extend_from_slice(
        &u32::try_from(message.len())
            .unwrap_or(u32::MAX)
            .to_be_bytes(),
    );
    plain.extend_from_slice(message);
    plain
        .chunks(MAX_RECORD_PLAINTEXT)
        .map(<[u8]>::to_vec)
        .collect()
}

/// Reassembles JSON-RPC messages from decrypted record plaintexts.
#[derive(Default)]
pub struct Reassembler {
    buf: Vec<u8>,
}

impl Reassembler {
    /// Appends one record's plaintext; returns the messages it completed.
    pub fn push(&mut self, plain: &[u8]) -> Vec<Vec<u8>> {
        self.buf.extend_from_slice(plain);
        let mut out = Vec::new();
        while self.buf.len() >= 4 {
            let len =
                u32::from_be_bytes([self.buf[0], self.buf[1], self.buf[2], self.buf[3]]) as usize;
            if self.buf.len() < 4 + len {
                break;
            }
            out.push(self.buf[4..4 + len].to_vec());
            self.buf.drain(..4 + len);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_ends_agree_on_the_codex_suite_and_exchange_records() {
        let exec = StaticKeys::generate().unwrap();
        let (x, k) = (exec.x25519_public(), exec.mlkem_public());
        assert_eq!((x.len(), k.len()), (32, 1184));
        let p = prologue("env_1", "exreg_1", "s1");
        assert_eq!(&p[..8], &(PROLOGUE_LABEL.len() as u64).to_be_bytes());
        let mut i = initiator(StaticKeys::generate().unwrap(), &x, &k, &p).unwrap();
        let mut r = responder(exec, &p).unwrap();
        assert_eq!(i.get_name().as_str(), PROTOCOL_NAME);
        let m1 = write(&mut i, b"auth").unwrap();
        assert_eq!(read(&mut r, &m1).unwrap(), b"auth");
        let m2 = write(&mut r, &[]).unwrap();
        assert_eq!(m2.len(), 3424, "msg2 size as observed from codex 0.171.0");
        read(&mut i, &m2).unwrap();
        let (mut ti, mut tr) = (i.finalize().unwrap(), r.finalize().unwrap());
        let big = vec![b'x'; 70_000];
        let mut re = Reassembler::default();
        let mut got = Vec::new();
        for rec in records(&big) {
            got.extend(re.push(&tr.receive_vec(&ti.send_vec(&rec).unwrap()).unwrap()));
        }
        assert_eq!(got, vec![big]);
        // A wrong prologue does not decrypt.
        let mut i2 = initiator(StaticKeys::generate().unwrap(), &x, &k, &p).unwrap();
        let exec2 = StaticKeys::generate().unwrap();
        let mut r2 = responder(exec2, &prologue("env_1", "exreg_1", "s2")).unwrap();
        assert!(read(&mut r2, &write(&mut i2, b"a").unwrap()).is_err());
    }
}
