//! The relay's binary frames: `codex.exec_server.relay.v1.RelayMessageFrame`, encoded by
//! hand (protobuf wire format, no build script, no protoc; the message is small and flat
//! enough that a ~150-line codec is lighter than `prost` and its derive machinery).
//!
//! Fields (../shared/reference/executor-protocol.md, "Registration and rendezvous", 3):
//! `version=1` (uint32, must be 1), `stream_id=2` (string), `ack=3`, `ack_bits=4`, oneof
//! body { `data=5 {seq=1, segment_index=2, segment_count=3, payload=4}`, `ack=6 {}`,
//! `resume=7 {next_seq=1}`, `reset=8 {reason=1}`, `heartbeat=9 {}`, `handshake=10
//! {payload=1}` }, `traceparent=11`, `tracestate=12` (ignored here). Unknown fields are
//! skipped; a frame whose version is not 1 is refused.

/// The body of one frame.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Body {
    /// One Noise transport record of a stream, `seq` counting from 0 per direction.
    Data {
        /// Per stream and direction, 0, 1, 2, ...
        seq: u64,
        /// The payload: one encrypted Noise record.
        payload: Vec<u8>,
    },
    /// `RelayAck {}` (the acknowledgement numbers travel in the frame's `ack` fields).
    Ack,
    /// `RelayResume {next_seq}`: opens (or resumes) a stream.
    Resume {
        /// The next sequence number the sender expects.
        next_seq: u64,
    },
    /// `RelayReset {reason}`: the stream is abandoned.
    Reset {
        /// Why, e.g. `noise_relay_protocol_error`.
        reason: String,
    },
    /// `RelayHeartbeat {}`.
    Heartbeat,
    /// `RelayHandshake {payload}`: a Noise handshake message.
    Handshake {
        /// The Noise handshake message (msg1 from the harness, msg2 from the executor).
        payload: Vec<u8>,
    },
    /// No body, or one this codec does not know.
    None,
}

/// One `RelayMessageFrame`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Frame {
    /// The stream the frame belongs to (chosen by the harness).
    pub stream_id: String,
    /// What it carries.
    pub body: Body,
}

fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn put_key(out: &mut Vec<u8>, field: u32, wire: u8) {
    put_varint(out, (u64::from(field) << 3) | u64::from(wire));
}

fn put_bytes(out: &mut Vec<u8>, field: u32, bytes: &[u8]) {
    put_key(out, field, 2);
    put_varint(out, bytes.len() as u64);
    out.extend_from_slice(bytes);
}

fn put_u64(out: &mut Vec<u8>, field: u32, v: u64) {
    if v != 0 {
        put_key(out, field, 0);
        put_varint(out, v);
    }
}

impl Frame {
    /// The frame's protobuf bytes (a binary WebSocket message).
    #[must_use]
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::new();
        put_u64(&mut out, 1, 1);
        put_bytes(&mut out, 2, self.stream_id.as_bytes());
        let mut inner = Vec::new();
        let field = match &self.body {
            Body::Data { seq, payload } => {
                put_u64(&mut inner, 1, *seq);
                put_u64(&mut inner, 3, 1);
                put_bytes(&mut inner, 4, payload);
                5
            }
            Body::Ack => 6,
            Body::Resume { next_seq } => {
                put_u64(&mut inner, 1, *next_seq);
                7
            }
            Body::Reset { reason } => {
                put_bytes(&mut inner, 1, reason.as_bytes());
                8
            }
            Body::Heartbeat => 9,
            Body::Handshake { payload } => {
                put_bytes(&mut inner, 1, payload);
                10
            }
            Body::None => return out,
        };
        put_bytes(&mut out, field, &inner);
        out
    }

    /// Parses a frame.
    ///
    /// # Errors
    /// A message for truncated or malformed bytes, or a version other than 1.
    pub fn decode(bytes: &[u8]) -> Result<Frame, String> {
        let mut version = 0;
        let mut stream_id = String::new();
        let mut body = Body::None;
        for (field, value) in fields(bytes)? {
            match (field, value) {
                (1, Value::Varint(v)) => version = v,
                (2, Value::Bytes(b)) => {
                    stream_id = String::from_utf8(b.to_vec()).map_err(|_| "stream_id not UTF-8")?;
                }
                (5, Value::Bytes(b)) => {
                    let (mut seq, mut payload) = (0, Vec::new());
                    for f in fields(b)? {
                        match f {
                            (1, Value::Varint(v)) => seq = v,
                            (4, Value::Bytes(p)) => payload = p.to_vec(),
                            _ => {}
                        }
                    }
                    body = Body::Data { seq, payload };
                }
                (6, Value::Bytes(_)) => body = Body::Ack,
                (7, Value::Bytes(b)) => {
                    let mut next_seq = 0;
                    for f in fields(b)? {
                        if let (1, Value::Varint(v)) = f {
                            next_seq = v;
                        }
                    }
                    body = Body::Resume { next_seq };
                }
                (8, Value::Bytes(b)) => {
                    let mut reason = String::new();
                    for f in fields(b)? {
                        if let (1, Value::Bytes(r)) = f {
                            reason = String::from_utf8_lossy(r).into_owned();
                        }
                    }
                    body = Body::Reset { reason };
                }
                (9, Value::Bytes(_)) => body = Body::Heartbeat,
                (10, Value::Bytes(b)) => {
                    let mut payload = Vec::new();
                    for f in fields(b)? {
                        if let (1, Value::Bytes(p)) = f {
                            payload = p.to_vec();
                        }
                    }
                    body = Body::Handshake { payload };
                }
                _ => {}
            }
        }
        if version != 1 {
            return Err(format!("relay frame version {version}, expected 1"));
        }
        Ok(Frame { stream_id, body })
    }
}

enum Value<'a> {
    Varint(u64),
    Bytes(&'a [u8]),
    Fixed,
}

fn varint(bytes: &[u8], pos: &mut usize) -> Result<u64, String> {
    let mut v = 0u64;
    for shift in (0..64).step_by(7) {
        let b = *bytes.get(*pos).ok_or("truncated varint")?;
        *pos += 1;
        v |= u64::from(b & 0x7f) << shift;
        if b & 0x80 == 0 {
            return Ok(v);
        }
    }
    Err("varint too long".to_owned())
}

fn fields(bytes: &[u8]) -> Result<Vec<(u64, Value<'_>)>, String> {
    let mut out = Vec::new();
    let mut pos = 0;
    while pos < bytes.len() {
        let key = varint(bytes, &mut pos)?;
        let value = match key & 7 {
            0 => Value::Varint(varint(bytes, &mut pos)?),
            2 => {
                let len = usize::try_from(varint(bytes, &mut pos)?).map_err(|_| "length")?;
                let end = pos.checked_add(len).filter(|e| *e <= bytes.len());
                let end = end.ok_or("truncated length-delimited field")?;
                let v = Value::Bytes(&bytes[pos..end]);
                pos = end;
                v
            }
            1 => {
                pos += 8;
                Value::Fixed
            }
            5 => {
                pos += 4;
                Value::Fixed
            }
            w => return Err(format!("unsupported wire type {w}")),
        };
        if pos > bytes.len() {
            return Err("truncated fixed field".to_owned());
        }
        out.push((key >> 3, value));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_body_survives_a_round_trip() {
        for body in [
            Body::Data {
                seq: 300,
                payload: vec![1, 2, 3],
            },
            Body::Ack,
            Body::Resume { next_seq: 0 },
            Body::Reset {
                reason: "noise_relay_protocol_error".into(),
            },
            Body::Heartbeat,
            Body::Handshake {
                payload: vec![9; 4000],
            },
        ] {
            let f = Frame {
                stream_id: "s1".into(),
                body,
            };
            assert_eq!(Frame::decode(&f.encode()).unwrap(), f);
        }
        // Resume{} is an empty message on field 7, not an absent body.
        let bytes = Frame {
            stream_id: "s".into(),
            body: Body::Resume { next_seq: 0 },
        }
        .encode();
        assert_eq!(bytes, [0x08, 1, 0x12, 1, b's', 0x3a, 0]);
        assert!(Frame::decode(&[0x08, 2]).is_err());
        assert!(Frame::decode(&[0x12, 5, b'a']).is_err());
    }
}
