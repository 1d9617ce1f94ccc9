//! The codec of every gangway service: prost's encoding, except that a message that
//! does not decode is INVALID_ARGUMENT (the sender's fault) instead of tonic's INTERNAL,
//! so clients do not retry it or report a server bug. Named by `build.rs`
//! (`codec_path`) for every generated client and server. On the client side a reply
//! that does not decode is reported the same way (a server never sends one).

use std::marker::PhantomData;

use prost::Message;
use tonic::codec::{BufferSettings, Codec, DecodeBuf, Decoder};
use tonic::{Code, Status};
use tonic_prost::{ProstDecoder, ProstEncoder};

/// prost encoding; undecodable input answered INVALID_ARGUMENT.
#[derive(Debug, Clone)]
pub struct GangwayCodec<T, U>(PhantomData<(T, U)>);

impl<T, U> Default for GangwayCodec<T, U> {
    fn default() -> Self {
        Self(PhantomData)
    }
}

impl<T, U> Codec for GangwayCodec<T, U>
where
    T: Message + Send + 'static,
    U: Message + Default + Send + 'static,
{
    type Encode = T;
    type Decode = U;
    type Encoder = ProstEncoder<T>;
    type Decoder = InvalidArgumentDecoder<U>;

    fn encoder(&mut self) -> Self::Encoder {
        ProstEncoder::new(BufferSettings::default())
    }

    fn decoder(&mut self) -> Self::Decoder {
        InvalidArgumentDecoder(ProstDecoder::new(BufferSettings::default()))
    }
}

/// prost's decoder with its parse errors turned into INVALID_ARGUMENT.
#[derive(Debug, Clone)]
pub struct InvalidArgumentDecoder<U>(ProstDecoder<U>);

impl<U: Message + Default> Decoder for InvalidArgumentDecoder<U> {
    type Item = U;
    type Error = Status;

    fn decode(&mut self, buf: &mut DecodeBuf<'_>) -> Result<Option<U>, Status> {
        self.0.decode(buf).map_err(|s| match s.code() {
            Code::Internal => Status::invalid_argument(format!(
                "not a valid {} message: {}",
                message_name::<U>(),
                s.message()
            )),
            _ => s,
        })
    }

    fn buffer_settings(&self) -> BufferSettings {
        self.0.buffer_settings()
    }
}

/// The message's type name without its module path (`RegisterNodeRequest`).
fn message_name<U>() -> &'static str {
    let full = std::any::type_name::<U>();
    full.rsplit("::").next().unwrap_or(full)
}
