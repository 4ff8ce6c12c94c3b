//! The only place that parses bytes from peers: a version byte, then a bincode-2 body decoded
//! with a size limit, and nothing after it; [`check`] then holds a frame's values to the
//! cluster's policies and the protocol's bounds.
//!
//! A frame that is empty, too large, of another version, malformed or followed by trailing
//! bytes is a typed [`WireError`]; decoding never panics and never allocates more than the
//! limit, whatever the bytes claim (a 9-byte input claiming a 16 TiB string is refused
//! before any allocation). Messages use bincode's own `Encode`/`Decode` derives rather than
//! serde: bincode then checks every container's claimed length times its element size
//! against the limit before allocating, where serde's path would preallocate up to 1 MiB.

use bincode::config::{self, Configuration, Limit, LittleEndian, Varint};
use bincode::{Decode, Encode};

use crate::mesh::message::{Ext, MAX_EXT_BODY_BYTES};

pub(crate) mod check;

/// The version of the frames this build writes and reads.
pub(crate) const WIRE_VERSION: u8 = 8;

/// The largest frame accepted, in bytes (datagrams stay far below; snapshots are chunked).
pub(crate) const MAX_FRAME_BYTES: usize = 64 * 1024;

/// The bincode configuration for peer data: varints, little endian, at most
/// `MAX_FRAME_BYTES` claimed by any length prefix.
const LIMITED: Configuration<LittleEndian, Varint, Limit<MAX_FRAME_BYTES>> =
    config::standard().with_limit::<MAX_FRAME_BYTES>();

/// Why a frame was refused. Nothing it carried was applied.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    /// No bytes at all.
    #[error("empty frame")]
    Empty,
    /// More bytes than any valid frame has.
    #[error("frame of {len} bytes exceeds the limit of {max}")]
    TooLarge {
        /// The frame's length.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// A version this build does not speak.
    #[error("frame version {found}, this node speaks {expected}")]
    UnknownVersion {
        /// The version byte found.
        found: u8,
        /// The version expected.
        expected: u8,
    },
    /// The body does not decode.
    #[error("malformed frame: {reason}")]
    Malformed {
        /// The decoder's explanation.
        reason: String,
    },
    /// The body decoded but bytes were left over.
    #[error("{extra} trailing bytes after a {consumed}-byte body")]
    TrailingBytes {
        /// Bytes the body used.
        consumed: usize,
        /// Bytes left.
        extra: usize,
    },
    /// A value this node wanted to send could not be encoded.
    #[error("cannot encode: {reason}")]
    Encode {
        /// The encoder's explanation.
        reason: String,
    },
}

/// Encode `message` as a frame: the version byte, then the body.
#[cfg(test)]
pub(crate) fn encode<T: Encode>(message: &T) -> Result<Vec<u8>, WireError> {
    let mut frame = begin(encoded_len(message).saturating_add(1));
    write(message, &mut frame)?;
    checked(frame)
}

/// Encode a frame of `header` and `count` items, byte for byte what [`encode`] makes of a
/// frame holding them (its item list is a length, then the items), into a buffer of
/// `capacity` bytes to begin with (the frame's length when the caller knows it: one
/// allocation).
pub(crate) fn encode_frame<'a, H: Encode, I: Encode + 'a>(
    header: &H,
    count: usize,
    items: impl Iterator<Item = &'a I>,
    capacity: usize,
) -> Result<Vec<u8>, WireError> {
    let mut frame = begin(capacity);
    write(header, &mut frame)?;
    write(&(count as u64), &mut frame)?;
    let mut written = 0;
    for item in items {
        write(item, &mut frame)?;
        written += 1;
    }
    if written != count {
        return Err(WireError::Encode {
            reason: format!("{written} items for a frame of {count}"),
        });
    }
    checked(frame)
}

/// A frame's buffer with its version byte.
fn begin(capacity: usize) -> Vec<u8> {
    let mut frame = Vec::with_capacity(capacity.min(MAX_FRAME_BYTES));
    frame.push(WIRE_VERSION);
    frame
}

/// Append `value`'s encoding to `frame`.
fn write<T: Encode>(value: &T, frame: &mut Vec<u8>) -> Result<(), WireError> {
    bincode::encode_into_writer(value, Appender(frame), LIMITED).map_err(|e| WireError::Encode {
        reason: e.to_string(),
    })
}

/// A frame's buffer as bincode's writer: each value's bytes appended (`std::io::Write`
/// would do the same, through a layer of its own per value).
struct Appender<'a>(&'a mut Vec<u8>);

impl bincode::enc::write::Writer for Appender<'_> {
    #[inline(always)]
    fn write(&mut self, bytes: &[u8]) -> Result<(), bincode::error::EncodeError> {
        self.0.extend_from_slice(bytes);
        Ok(())
    }
}

/// `frame`, unless it is larger than any frame a peer accepts.
fn checked(frame: Vec<u8>) -> Result<Vec<u8>, WireError> {
    if frame.len() > MAX_FRAME_BYTES {
        return Err(WireError::TooLarge {
            len: frame.len(),
            max: MAX_FRAME_BYTES,
        });
    }
    Ok(frame)
}

/// Decode a frame received from a peer.
pub(crate) fn decode<T: Decode<()>>(frame: &[u8]) -> Result<T, WireError> {
    let (&version, body) = frame.split_first().ok_or(WireError::Empty)?;
    if frame.len() > MAX_FRAME_BYTES {
        return Err(WireError::TooLarge {
            len: frame.len(),
            max: MAX_FRAME_BYTES,
        });
    }
    if version != WIRE_VERSION {
        return Err(WireError::UnknownVersion {
            found: version,
            expected: WIRE_VERSION,
        });
    }
    let (message, consumed) =
        bincode::decode_from_slice::<T, _>(body, LIMITED).map_err(|e| WireError::Malformed {
            reason: e.to_string(),
        })?;
    if consumed != body.len() {
        return Err(WireError::TrailingBytes {
            consumed,
            extra: body.len() - consumed,
        });
    }
    Ok(message)
}

/// Encode a value kept on disk (a snapshot) or carried in a question's body: bincode as on
/// the wire, without the frame's version byte, at most [`MAX_FRAME_BYTES`].
pub(crate) fn encode_saved<T: Encode>(value: &T) -> Result<Vec<u8>, WireError> {
    let mut bytes = Vec::with_capacity(encoded_len(value).min(MAX_FRAME_BYTES));
    bincode::encode_into_std_write(value, &mut bytes, LIMITED).map_err(|e| {
        WireError::Malformed {
            reason: e.to_string(),
        }
    })?;
    Ok(bytes)
}

/// Decode a value [`encode_saved`] made: all of it, nothing after.
pub(crate) fn decode_saved<T: Decode<()>>(bytes: &[u8]) -> Result<T, WireError> {
    let (value, consumed) =
        bincode::decode_from_slice::<T, _>(bytes, LIMITED).map_err(|e| WireError::Malformed {
            reason: e.to_string(),
        })?;
    if consumed != bytes.len() {
        return Err(WireError::TrailingBytes {
            consumed,
            extra: bytes.len() - consumed,
        });
    }
    Ok(value)
}

/// Encode an extension item's body ([`crate::mesh::message::Ext`]).
pub(crate) fn encode_ext<T: Encode>(kind: u32, body: &T) -> Result<Ext, WireError> {
    let mut bytes = Vec::with_capacity(encoded_len(body).min(MAX_EXT_BODY_BYTES));
    write(body, &mut bytes)?;
    if bytes.len() > MAX_EXT_BODY_BYTES {
        return Err(WireError::TooLarge {
            len: bytes.len(),
            max: MAX_EXT_BODY_BYTES,
        });
    }
    Ok(Ext { kind, body: bytes })
}

/// Decode an extension item's body as a `T`: all of it, nothing after.
pub(crate) fn decode_ext<T: Decode<()>>(ext: &Ext) -> Result<T, WireError> {
    let (value, consumed) =
        bincode::decode_from_slice::<T, _>(&ext.body, LIMITED).map_err(|e| {
            WireError::Malformed {
                reason: e.to_string(),
            }
        })?;
    if consumed != ext.body.len() {
        return Err(WireError::TrailingBytes {
            consumed,
            extra: ext.body.len() - consumed,
        });
    }
    Ok(value)
}

/// Return the bytes `message` takes in a frame body (without the version byte).
pub(crate) fn encoded_len<T: Encode>(message: &T) -> usize {
    let mut size = bincode::enc::write::SizeWriter::default();
    match bincode::encode_into_writer(message, &mut size, LIMITED) {
        Ok(()) => size.bytes_written,
        Err(_) => usize::MAX,
    }
}

#[cfg(test)]
mod compat;
#[cfg(test)]
mod tests;
