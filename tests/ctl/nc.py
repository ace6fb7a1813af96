"""nc: a minimal client of the controller's protocol (docs/protocol.md) for
tests/ctl/join_cases.py: frame encoders and a peer that reads frames with a
time-out. Test code only: the runtime's encoders are runtime/ctl/proto.c."""
import socket, struct, sys, time, select, os
MAGIC=0x4353524e
T={'HELLO':1,'PLAN':2,'REPORT':3,'DELTA':4,'DELTA_REPLY':5,'STATUS_REQ':6,'STATUS':7,'PREPARE':8,'ACK':9,'COMMIT':10,'ABORT':11,'ERROR':12,'GATHER':13,'GATHERED':14,'WORLD':15}
N={v:k for k,v in T.items()}
def s(x):
    b=x.encode(); return struct.pack('<H',len(b))+b
def frame(t,p,flags=0): return struct.pack('<IHHII',MAGIC,1,T[t],flags,len(p))+p
def hello(role,rank,nranks,host='h0',job='',token=''):
    return frame('HELLO',struct.pack('<I',role)+s(job)+struct.pack('<ii',rank,nranks)+s(host)+s(token))
def ack(epoch,phase,status=0,secs=0.0):
    return frame('ACK',struct.pack('<IIid',epoch,phase,status,secs))
def report(epoch,step,stages=((0,1.0),),resp=100.0,flags=0):
    p=struct.pack('<IIId',epoch,step,flags,resp)+struct.pack('<B',len(stages))
    for ms,sec in stages: p+=struct.pack('<Bd',ms,sec)
    return frame('REPORT',p)
def delta(kind,gen=0,add=0,hosts=(),gpus=()):
    p=struct.pack('<QII',gen,kind,add)+struct.pack('<H',len(hosts))
    for h in hosts: p+=s(h)
    p+=struct.pack('<H',len(gpus))+b''.join(struct.pack('<i',g) for g in gpus)
    return frame('DELTA',p)
def gather(key,name,nranks,data=b'',out=(),timeout_ms=30000):
    p=struct.pack('<Q',key)+s(name)+struct.pack('<Ii',timeout_ms,nranks)+struct.pack('<I',len(out))+b''.join(struct.pack('<i',o) for o in out)+struct.pack('<I',len(data))+data
    return frame('GATHER',p)
def status_req(fmt=1): return frame('STATUS_REQ',struct.pack('<I',fmt))
def plan_info(p):
    """A PLAN payload's (epoch, prev_epoch, flags, total_gpus, lost GPUs)."""
    ep,prev,fl,total,npools=struct.unpack_from('<IIIiB',p); o=17+8*npools
    nms=p[o]; o+=1
    for _ in range(nms):
        has=p[o]; o+=1
        if has: o+=1+4*4+2*8
    o+=6*8
    nl,=struct.unpack_from('<I',p,o)
    return ep,prev,fl,total,list(struct.unpack_from('<%di'%nl,p,o+4))
class Peer:
    def __init__(self,path):
        self.s=socket.socket(socket.AF_UNIX,socket.SOCK_STREAM); self.s.connect(path); self.buf=b''; self.closed=False
    def send(self,b): self.s.sendall(b)
    def recv(self,timeout=5.0):
        end=time.time()+timeout
        while True:
            if len(self.buf)>=16:
                m,v,t,f,l=struct.unpack('<IHHII',self.buf[:16])
                if len(self.buf)>=16+l:
                    p=self.buf[16:16+l]; self.buf=self.buf[16+l:]; return (N.get(t,t),f,p)
            left=end-time.time()
            if left<=0: return None
            po=select.poll(); po.register(self.s,select.POLLIN)
            if not po.poll(int(left*1000)+1): return None
            d=self.s.recv(1<<20)
            if not d: self.closed=True; return ('EOF',0,b'')
            self.buf+=d
    def drain(self,timeout=0.2):
        out=[]
        while True:
            x=self.recv(timeout)
            if x is None: return out
            out.append(x)
            if x[0]=='EOF': return out
def find(peer,typ,timeout=5.0):
    """The next frame of type typ (or EOF) peer gets within timeout, or None."""
    end=time.time()+timeout
    while time.time()<end:
        x=peer.recv(max(0.01,end-time.time()))
        if x is None or x[0] in (typ,'EOF'): return x
    return None
def transition(peers):
    """Each peer ACKs PREPARE, then COMMIT (exit 1 if one lacks either)."""
    ep=None
    for p in peers:
        x=find(p,'PREPARE')
        if not x or x[0]!='PREPARE':
            print('FAIL: no PREPARE:',x and x[0]); sys.exit(1)
        ep=struct.unpack_from('<I',x[2])[0]
        p.send(ack(ep,8))
    for p in peers:
        x=find(p,'COMMIT')
        if not x or x[0]!='COMMIT':
            print('FAIL: no COMMIT:',x and x[0]); sys.exit(1)
        p.send(ack(ep,10,0,0.1))
    time.sleep(0.3)
def errtext(p):
    code,=struct.unpack('<I',p[:4]); l,=struct.unpack('<H',p[4:6]); return code,p[6:6+l].decode(errors='replace')
def status_raw(path,fmt=1):
    """The whole STATUS reply's bytes (fmt 0 text, 1 JSON); None if it broke off."""
    c=Peer(path); c.send(hello(3,0,0)+status_req(fmt)); txt=b''
    while True:
        x=c.recv(10)
        if x is None or x[0]!='STATUS': return None
        txt+=x[2]
        if not (x[1]&1): break
    c.s.close(); return txt
def status(path):
    import json; return json.loads(status_raw(path))
