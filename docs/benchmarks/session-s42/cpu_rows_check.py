"""Session s42: rows_debug.py's eager case on the CPU (the demo codec in fp32): rows 1-3 decoded
together, the host's rows set as a graph sets them (the spare row), against lone decoders. Prints
bucket, stream, the largest difference of each of the two chunks, the lone stream's peak."""
import sys, numpy as np, torch
sys.path.insert(0,'.')
from engine.config import EngineConfig
from engine.loader import load_models
from engine.model.codec_stream import StreamingDecoder, Rows
codec = load_models(EngineConfig(demo=True, device="cpu")).codec
gen = torch.Generator().manual_seed(3)
streams = {row: torch.cat([torch.randint(0, 4096, (1, 12), generator=gen), torch.randint(0, 1024, (9, 12), generator=gen)]) for row in range(4)}
lone={}
for r,c in streams.items():
    d=StreamingDecoder(codec); lone[r]=[d.decode(c[None,:,0:4])[0,0], d.decode(c[None,:,4:12])[0,0]]
def graphlike(dec, codes, rows, bucket):
    b=len(rows)
    idx=torch.full((bucket,),4); idx[:b]=torch.tensor(rows)
    full=torch.zeros(bucket,10,codes.shape[-1],dtype=torch.long); full[:b]=codes
    dec.reset_rows(Rows(torch.tensor([4]), np.full(1,4)))
    return dec.decode_rows(full, Rows(idx, np.full(bucket,4)))[:b,0]
for bucket in (3,4):
  with torch.inference_mode():
    dec=StreamingDecoder(codec,batch=5); dec.reserve(300)
    a0=dec.decode(streams[0][None,:,0:4],rows=[0])[0,0]
    dec.reset([1,2,3])
    first=graphlike(dec, torch.stack([streams[r][:,0:4] for r in (1,2,3)]), [1,2,3], bucket)
    a0b=graphlike(dec, streams[0][None,:,4:12], [0], 1)
    second=graphlike(dec, torch.stack([streams[r][:,4:12] for r in (1,2,3)]), [1,2,3], bucket)
  for i,r in enumerate((1,2,3)):
    print(bucket, r, float((first[i]-lone[r][0]).abs().max()), float((second[i]-lone[r][1]).abs().max()), float(lone[r][0].abs().max()))
