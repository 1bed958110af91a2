"""The report page: ``render(data)`` puts the data, the style and a small canvas viewer into one HTML file.

No library and no network: the viewer is about 300 lines of plain JavaScript drawing on ``<canvas>``
(a timeline that zooms, re-bucketing per pixel column by maximum so no peak is lost, and a segment
map with hover), and the data is one JSON object in the page. Why not Plotly or Bokeh: see docs/report.md.

Every byte count the page shows is the exact integer: a JSON number past 2**53 would lose its last
digits in JavaScript, so ``_js_safe`` writes such integers as decimal strings and the viewer formats
byte counts with ``BigInt`` (``exact``, ``fmt``); ``Number`` only positions what it draws (``num``).
"""

from __future__ import annotations

import json
from typing import Any

#: The largest integer a JavaScript Number holds exactly (``Number.MAX_SAFE_INTEGER``).
JS_SAFE_INTEGER = (1 << 53) - 1

_STYLE = """
body{font:14px/1.4 system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:0;color:#1d1d1f;background:#fafafa}
header{background:#fff;border-bottom:1px solid #ddd;padding:12px 20px}
h1{font-size:20px;margin:0 0 6px} h2{font-size:16px;margin:22px 0 8px}
main{padding:0 20px 40px;max-width:1400px}
.verdict{border-radius:6px;padding:10px 14px;margin:8px 0;font-weight:600;border:1px solid}
.fits{background:#e8f6ee;border-color:#2ca58d}.oom{background:#fdecec;border-color:#c8323c}.nocap{background:#eef3fb;border-color:#1f5fa8}
.verdict small{display:block;font-weight:400;color:#555}
table{border-collapse:collapse;margin:6px 0;background:#fff}
td,th{border:1px solid #ddd;padding:3px 8px;text-align:right;font-variant-numeric:tabular-nums}
th{background:#f0f0f0} td.l,th.l{text-align:left} small.exact{display:block;color:#666;font-size:11px}
canvas{display:block;background:#fff;border:1px solid #ddd}
.controls{margin:6px 0} .controls button,.controls select{margin-right:6px}
#tip{position:fixed;pointer-events:none;background:#fff;border:1px solid #888;border-radius:4px;padding:6px 8px;
 font-size:12px;max-width:640px;box-shadow:0 2px 8px rgba(0,0,0,.2);display:none;z-index:9;white-space:pre-wrap}
.legend span{display:inline-block;margin-right:12px;font-size:12px}
.legend i{display:inline-block;width:12px;height:12px;margin-right:4px;vertical-align:-2px}
#mapwrap{height:560px;overflow-y:auto;position:relative;border:1px solid #ddd;background:#fff}
#mapcanvas{position:sticky;top:0;border:0}
pre{background:#fff;border:1px solid #ddd;padding:8px;overflow-x:auto;font-size:12px}
details summary{cursor:pointer} .frames{font:12px monospace;color:#333;text-align:left;white-space:pre-wrap}
.cols{display:flex;gap:24px;flex-wrap:wrap}
.cuts{color:#555;font-size:13px;margin-top:8px}
"""

_SCRIPT = r"""
"use strict";
const D = JSON.parse(document.getElementById("data").textContent);
const CAT_COLORS = {parameter:"#1f5fa8",gradient:"#e08a1e",optimizer_state:"#7b4fa0",activation:"#2ca58d",
  temporary:"#8fbce6",autograd_detail:"#f2a3a8",workspace:"#6b4f3a",unknown:"#9a9a9a",preallocated:"#4b5f7a"};
const STATE_COLORS = {requested:null,rounding:"#cfe3f5",pending_free:"#b59bd0",gc_queue:"#f0b060",free:"#f2cc4d",
  stranded:"#c8323c",device_rounding:"#6b4f3a"};
const RUN_COLORS = ["#1f5fa8","#c8323c","#7b4fa0","#e08a1e","#2ca58d","#555555"];
const tip = document.getElementById("tip");
// Byte counts past 2**53 come as decimal strings (a JSON number would lose digits): shown through BigInt, exactly;
// num() is for positions and proportions only.
function big(b){ return typeof b==="bigint"?b:(typeof b==="string"?BigInt(b):BigInt(Math.round(b))); }
function num(b){ return typeof b==="number"?b:Number(b); }
function exact(b){ if(b===null||b===undefined) return "-"; const s=big(b).toString(), neg=s[0]==="-";
  return (neg?"-":"")+(neg?s.slice(1):s).replace(/\B(?=(\d{3})+(?!\d))/g,","); }
function fmt(b){ if(b===null||b===undefined) return "-"; const u=["B","KiB","MiB","GiB","TiB","PiB","EiB"];
  const v=big(b), a=v<0n?-v:v, sign=v<0n?"-":""; let i=0; while(i<u.length-1&&a>=(1n<<BigInt(10*(i+1)))) i++;
  if(!i) return sign+a.toString()+" B"; const scale=1n<<BigInt(10*i), h=(a*100n+scale/2n)/scale;   // hundredths, half up
  return sign+(h/100n).toString()+"."+(h%100n).toString().padStart(2,"0")+" "+u[i]; }
function both(b){ return (b===null||b===undefined)?"-":fmt(b)+" ("+exact(b)+" bytes)"; }
function total(values){ return values.reduce((a,v)=>a+big(v),0n); }
function bytesTd(b){ const td=el("td",{},fmt(b)); if(b!==null&&b!==undefined) td.appendChild(el("small",{"class":"exact"},exact(b)+" bytes"));
  return td; }
function el(tag, attrs, text){ const e=document.createElement(tag); for(const k in (attrs||{})) e.setAttribute(k, attrs[k]);
  if(text!==undefined) e.textContent=text; return e; }
function showTip(ev, text){ tip.textContent=text; tip.style.display="block";
  const x=Math.min(ev.clientX+14, window.innerWidth-660); tip.style.left=Math.max(0,x)+"px";
  tip.style.top=Math.min(ev.clientY+14, window.innerHeight-200)+"px"; }
function hideTip(){ tip.style.display="none"; }
function stackText(s){ if(s<0) return "  (no frames recorded)"; const fr=D.stacks[s]; if(!fr||!fr.length) return "  (no frames)";
  return fr.map(f=>"  "+D.frames[f]).join("\n"); }
function allocText(row){ const a=D.allocs[row]; if(!a) return "";
  const born=num(a[3])<0?"before the trace began":"event "+exact(a[3]);
  const died=num(a[4])<0?"still live at the end":"event "+exact(a[4]);
  return "allocation "+a[0]+": "+both(a[1])+"\ncategory: "+D.categories[a[2]]+
    "\nlifetime: from "+born+" to "+died+"\nstack (program frames first, marked *):\n"+stackText(a[5]); }

// ------------------------------------------------------------------ verdicts and summary
function cuts(){
  const box=document.getElementById("cuts"); (D.cuts||[]).forEach(c=>box.appendChild(el("div",{},"not shown: "+c))); }
function verdicts(){
  const box=document.getElementById("verdicts");
  D.runs.forEach(r=>{ const cls=r.fits===true?"fits":(r.fits===false?"oom":"nocap");
    const d=el("div",{"class":"verdict "+cls,"data-policy":r.label}); d.appendChild(el("span",{"class":"vline"},r.verdict));
    d.appendChild(el("small",{},"policy "+r.label)); box.appendChild(d); });
  const t=document.getElementById("summary"); const head=el("tr"); ["policy","peak requested","peak allocated",
   "peak reserved","lower bound (peak live)","capacity","OOMs"].forEach((h,i)=>head.appendChild(el("th",i?{}:{"class":"l"},h)));
  t.appendChild(head);
  D.runs.forEach(r=>{ const tr=el("tr"); tr.appendChild(el("td",{"class":"l"},r.label));
    [r.peak_requested_bytes,r.peak_allocated_bytes,r.peak_reserved_bytes,r.lower_bound_bytes,r.capacity_bytes]
      .forEach(v=>tr.appendChild(bytesTd(v))); tr.appendChild(el("td",{},String(r.oom_count))); t.appendChild(tr); });
}

// ------------------------------------------------------------------ categories
function categories(){
  const box=document.getElementById("cats");
  D.runs.forEach(r=>{ if(!r.categories) return; ["at_peak","at_oom"].forEach(m=>{ const split=r.categories[m]; if(!split) return;
    const all=total(Object.values(split)), whole=num(all); const wrap=el("div");
    wrap.appendChild(el("div",{},r.label+" — "+(m==="at_peak"?"at the peak of requested memory":"at the first out-of-memory")+": "+both(all)));
    const c=el("canvas",{width:600,height:22}); wrap.appendChild(c); const g=c.getContext("2d"); let x=0;
    const parts=[]; D.categories.forEach(k=>{ const v=split[k]||0; if(!num(v)) return; const w=whole?num(v)/whole*600:0;
      g.fillStyle=CAT_COLORS[k]; g.fillRect(x,0,Math.max(w,1),22); parts.push([x,x+Math.max(w,1),k,v]); x+=w; });
    c.addEventListener("mousemove",ev=>{ const px=ev.offsetX; const p=parts.find(q=>px>=q[0]&&px<q[1]);
      if(p) showTip(ev, p[2]+": "+both(p[3])+", "+(100*num(p[3])/whole).toFixed(1)+"%"); else hideTip(); });
    c.addEventListener("mouseleave",hideTip);
    const tb=el("table"); D.categories.forEach(k=>{ const v=split[k]||0; if(!num(v)) return; const tr=el("tr");
      const td=el("td",{"class":"l"}); const sw=el("i"); sw.style.cssText="display:inline-block;width:10px;height:10px;margin-right:5px;background:"+CAT_COLORS[k];
      td.appendChild(sw); td.appendChild(document.createTextNode(k.replace("_"," "))); tr.appendChild(td);
      tr.appendChild(bytesTd(v)); tr.appendChild(el("td",{},(100*num(v)/whole).toFixed(1)+"%")); tb.appendChild(tr); });
    wrap.appendChild(tb); box.appendChild(wrap); }); });
}

// ------------------------------------------------------------------ timeline (zoom, per-pixel max)
const TL = {lo:0, hi:Math.max(D.timelines.events,1)};
function tlSeries(){
  const t=D.timelines, out=[{name:"live (program's requested bytes)",color:"#2ca58d",v:t.live,w:1.5}];
  if(t.recorded.reserved_bytes) out.push({name:"recorded reserved (the real allocator)",color:"#000",v:t.recorded.reserved_bytes,w:2,dash:[6,4]});
  if(t.recorded.allocated_bytes) out.push({name:"recorded allocated",color:"#666",v:t.recorded.allocated_bytes,w:1,dash:[2,3]});
  t.runs.forEach((r,i)=>{ const c=RUN_COLORS[i%RUN_COLORS.length];
    out.push({name:D.runs[i].label+": simulated reserved",color:c,v:r.reserved_bytes,w:1.5});
    out.push({name:D.runs[i].label+": simulated allocated",color:c,v:r.allocated_bytes,w:1,dash:[3,2]}); });
  return out;
}
function drawTimeline(){
  const c=document.getElementById("timeline"), g=c.getContext("2d"), W=c.width, H=c.height, L=70, R=10, T=10, B=30;
  g.clearRect(0,0,W,H); const xs=D.timelines.x, series=tlSeries(); const pw=W-L-R, ph=H-T-B;
  // Per pixel column: the maximum of every bucket that starts in it (or the bucket in force there), and which
  // bucket holds it (its exact value is shown on hover).
  const cols=[], ats=[]; let ymax=1;
  series.forEach(s=>{ const col=new Array(pw).fill(-1), at=new Array(pw).fill(-1);
    for(let i=0;i<xs.length;i++){ const a=xs[i], b=(i+1<xs.length?xs[i+1]:D.timelines.events);
      if(b<=TL.lo||a>=TL.hi) continue;
      let p0=Math.floor((Math.max(a,TL.lo)-TL.lo)/(TL.hi-TL.lo)*pw), p1=Math.ceil((Math.min(b,TL.hi)-TL.lo)/(TL.hi-TL.lo)*pw)-1;
      p0=Math.max(0,Math.min(pw-1,p0)); p1=Math.max(p0,Math.min(pw-1,p1));
      const v=num(s.v[i]);
      for(let p=p0;p<=p1;p++) if(v>col[p]||(v===col[p]&&big(s.v[i])>big(s.v[at[p]]))){ col[p]=v; at[p]=i; } }
    col.forEach(v=>{ if(v>ymax) ymax=v; }); cols.push(col); ats.push(at); });
  TL.cols=cols; TL.ats=ats; TL.ymax=ymax; TL.series=series;
  g.strokeStyle="#ddd"; g.fillStyle="#333"; g.font="11px sans-serif";
  for(let k=0;k<=4;k++){ const y=T+ph-k/4*ph; g.beginPath(); g.moveTo(L,y); g.lineTo(W-R,y); g.stroke(); g.fillText(fmt(ymax*k/4),4,y+4); }
  for(let k=0;k<=5;k++){ const x=L+k/5*pw; g.fillText(Math.round(TL.lo+k/5*(TL.hi-TL.lo)).toLocaleString(),x-10,H-12); }
  g.fillText("event number",W/2-30,H-1);
  series.forEach((s,j)=>{ g.strokeStyle=s.color; g.lineWidth=s.w; g.setLineDash(s.dash||[]); g.beginPath(); let on=false;
    cols[j].forEach((v,p)=>{ if(v<0){on=false;return;} const y=T+ph-v/ymax*ph; if(!on){g.moveTo(L+p,y);on=true;} else g.lineTo(L+p,y); g.lineTo(L+p+1,y); });
    g.stroke(); }); g.setLineDash([]); g.lineWidth=1;
  if(TL.sel){ g.fillStyle="rgba(31,95,168,.15)"; g.fillRect(Math.min(TL.sel[0],TL.sel[1]),T,Math.abs(TL.sel[1]-TL.sel[0]),ph); }
  drawCatTimeline();
  const lg=document.getElementById("tllegend"); lg.textContent="";
  series.forEach(s=>{ const sp=el("span"); const i=el("i"); i.style.background=s.color; sp.appendChild(i); sp.appendChild(document.createTextNode(s.name)); lg.appendChild(sp); });
}
function timelineEvents(){
  const c=document.getElementById("timeline"), L=70, R=10;
  const toEvent=px=>TL.lo+(px-L)/(c.width-L-R)*(TL.hi-TL.lo);
  c.addEventListener("mousedown",ev=>{ TL.sel=[ev.offsetX,ev.offsetX]; });
  c.addEventListener("mousemove",ev=>{ if(TL.sel){ TL.sel[1]=ev.offsetX; drawTimeline(); return; }
    const p=ev.offsetX-L; if(!TL.cols||p<0||p>=TL.cols[0].length){ hideTip(); return; }
    const lines=["around event "+Math.round(toEvent(ev.offsetX)).toLocaleString()+" (max over this pixel column)"];
    TL.series.forEach((s,j)=>{ const i=TL.ats[j][p]; if(i>=0) lines.push(s.name+": "+both(s.v[i])); }); showTip(ev, lines.join("\n")); });
  c.addEventListener("mouseup",ev=>{ if(!TL.sel) return; const a=Math.min(TL.sel[0],TL.sel[1]), b=Math.max(TL.sel[0],TL.sel[1]); TL.sel=null;
    if(b-a>3){ const lo=toEvent(a), hi=toEvent(b); TL.lo=Math.max(0,lo); TL.hi=Math.max(TL.lo+1,hi); } drawTimeline(); });
  c.addEventListener("mouseleave",()=>{ TL.sel=null; hideTip(); });
  c.addEventListener("wheel",ev=>{ ev.preventDefault(); const at=toEvent(ev.offsetX), f=ev.deltaY>0?1.25:0.8;
    TL.lo=Math.max(0,at-(at-TL.lo)*f); TL.hi=Math.min(D.timelines.events,at+(TL.hi-at)*f); if(TL.hi-TL.lo<1) TL.hi=TL.lo+1; drawTimeline(); },{passive:false});
  document.getElementById("tlreset").addEventListener("click",()=>{ TL.lo=0; TL.hi=Math.max(D.timelines.events,1); drawTimeline(); });
}

// ------------------------------------------------------------------ live bytes by category over time
function drawCatTimeline(){
  const c=document.getElementById("cattimeline"), g=c.getContext("2d"), W=c.width, H=c.height, L=70, R=10, T=10, B=24;
  const ct=D.category_timeline; g.clearRect(0,0,W,H); if(!ct||!ct.x.length) return; const pw=W-L-R, ph=H-T-B, n=D.timelines.events||1;
  // Per pixel column: the bucket of largest total that starts in it, its categories stacked.
  const totals=ct.x.map((_,i)=>D.categories.reduce((a,k)=>a+num(ct.bytes[k][i]),0)); const best=new Array(pw).fill(-1);
  ct.x.forEach((a,i)=>{ const b=(i+1<ct.x.length?ct.x[i+1]:n); if(b<=TL.lo||a>=TL.hi) return;
    let p0=Math.floor((Math.max(a,TL.lo)-TL.lo)/(TL.hi-TL.lo)*pw), p1=Math.ceil((Math.min(b,TL.hi)-TL.lo)/(TL.hi-TL.lo)*pw)-1;
    p0=Math.max(0,Math.min(pw-1,p0)); p1=Math.max(p0,Math.min(pw-1,p1));
    for(let p=p0;p<=p1;p++) if(best[p]<0||totals[i]>totals[best[p]]) best[p]=i; });
  let ymax=1; best.forEach(i=>{ if(i>=0&&totals[i]>ymax) ymax=totals[i]; });
  g.fillStyle="#333"; g.font="11px sans-serif"; for(let k=0;k<=2;k++){ const y=T+ph-k/2*ph; g.fillText(fmt(ymax*k/2),4,y+4); }
  best.forEach((i,p)=>{ if(i<0) return; let y=T+ph; D.categories.forEach(k=>{ const v=num(ct.bytes[k][i]); if(!v) return; const h=v/ymax*ph;
    g.fillStyle=CAT_COLORS[k]; g.fillRect(L+p,y-h,1,h); y-=h; }); });
  CT.best=best; CT.totals=totals;
}
const CT={};
function catTimelineEvents(){
  const c=document.getElementById("cattimeline"), L=70;
  c.addEventListener("mousemove",ev=>{ const p=ev.offsetX-L; if(!CT.best||p<0||p>=CT.best.length||CT.best[p]<0){ hideTip(); return; }
    const i=CT.best[p], ct=D.category_timeline;
    const lines=["after event "+exact(ct.event_index[i])+" (the largest total in this column): "+both(total(D.categories.map(k=>ct.bytes[k][i])))];
    D.categories.forEach(k=>{ if(num(ct.bytes[k][i])) lines.push(k.replace("_"," ")+": "+both(ct.bytes[k][i])); }); showTip(ev, lines.join("\n")); });
  c.addEventListener("mouseleave",hideTip);
}

// ------------------------------------------------------------------ segment map (rows = segments)
const MAP = {row:16};
function mapChoices(){
  const sel=document.getElementById("mapsel"); sel.textContent="";
  D.runs.forEach((r,i)=>{ Object.keys(r.maps).forEach(m=>{ const o=el("option",{value:i+"|"+m},
    r.label+" — "+(m==="peak_reserved"?"at the peak of reserved memory":"at the end of the run")+" (after event "+r.maps[m].event_index.toLocaleString()+")");
    sel.appendChild(o); }); });
  sel.addEventListener("change",selectMap); selectMap();
}
function selectMap(){
  const v=document.getElementById("mapsel").value; if(!v){ MAP.m=null; return; } const [i,m]=v.split("|"); MAP.m=D.runs[+i].maps[m];
  const bySeg=MAP.m.segments.map(()=>[]); MAP.m.pieces.forEach((p,k)=>bySeg[p[0]].push(k)); MAP.bySeg=bySeg;
  document.getElementById("mapspacer").style.height=Math.max(0,MAP.m.segments.length*MAP.row+4-document.getElementById("mapcanvas").height)+"px";
  document.getElementById("mapnote").textContent=MAP.m.segments.length.toLocaleString()+" segments, "+MAP.m.pieces.length.toLocaleString()+
    " pieces"+(MAP.m.truncated?" ("+MAP.m.truncated.toLocaleString()+" more pieces not shown)":"")+"; each row is one segment, drawn to its own width; hover a block for its stack";
  drawMap();
}
function pieceColor(p){ const st=D.states[p[3]]; if(st==="requested"||st==="pending_free"){ if(p[4]>=0){ const c=CAT_COLORS[D.categories[D.allocs[p[4]][2]]];
  return st==="pending_free"?STATE_COLORS.pending_free:c; } return "#9a9a9a"; } return STATE_COLORS[st]||"#ccc"; }
function drawMap(){
  const wrap=document.getElementById("mapwrap"), c=document.getElementById("mapcanvas"), g=c.getContext("2d");
  c.width=wrap.clientWidth-2; c.height=wrap.clientHeight-2; g.clearRect(0,0,c.width,c.height); if(!MAP.m) return;
  const top=wrap.scrollTop, L=150, W=c.width-L-8; g.font="11px sans-serif";
  const first=Math.floor(top/MAP.row), last=Math.min(MAP.m.segments.length, first+Math.ceil(c.height/MAP.row)+1);
  MAP.hit=[];
  for(let s=first;s<last;s++){ const seg=MAP.m.segments[s], y=s*MAP.row-top+2; g.fillStyle="#333";
    g.fillText(fmt(seg[1])+" "+seg[2],4,y+11); g.fillStyle="#f4f4f4"; g.fillRect(L,y,W,MAP.row-3);
    MAP.bySeg[s].forEach(k=>{ const p=MAP.m.pieces[k]; const x=L+num(p[1])/num(seg[1])*W, w=Math.max(1,num(p[2])/num(seg[1])*W);
      g.fillStyle=pieceColor(p); g.fillRect(x,y,w,MAP.row-3); MAP.hit.push([x,y,w,k,s]); }); }
}
function mapEvents(){
  const wrap=document.getElementById("mapwrap"), c=document.getElementById("mapcanvas");
  wrap.addEventListener("scroll",drawMap);
  c.addEventListener("mousemove",ev=>{ if(!MAP.hit) return; const x=ev.offsetX, y=ev.offsetY;
    let best=null; for(const h of MAP.hit){ if(y>=h[1]&&y<h[1]+MAP.row-3&&x>=h[0]-1&&x<=h[0]+h[2]+1){ best=h; if(x>=h[0]&&x<h[0]+h[2]) break; } }
    if(!best){ hideTip(); return; } const p=MAP.m.pieces[best[3]], seg=MAP.m.segments[best[4]], st=D.states[p[3]];
    let text=st.replace("_"," ")+": "+both(p[2])+" at offset "+both(p[1])+" of a "+both(seg[1])+" "+seg[2]+"-pool segment (stream "+seg[3]+")";
    if(p[4]>=0) text+="\n"+allocText(p[4]); showTip(ev,text); c.dataset.hovered=String(best[3]); });
  c.addEventListener("mouseleave",hideTip); window.addEventListener("resize",drawMap);
  const lg=document.getElementById("maplegend");
  D.categories.forEach(k=>{ const sp=el("span"); const i=el("i"); i.style.background=CAT_COLORS[k]; sp.appendChild(i); sp.appendChild(document.createTextNode(k.replace("_"," "))); lg.appendChild(sp); });
  ["rounding","pending_free","free","stranded","device_rounding"].forEach(k=>{ const sp=el("span"); const i=el("i"); i.style.background=STATE_COLORS[k];
    sp.appendChild(i); sp.appendChild(document.createTextNode(k==="free"?"free (cached)":(k==="stranded"?"free, cached for another stream":k.replace("_"," ")))); lg.appendChild(sp); });
}

// ------------------------------------------------------------------ code sites
function sites(){
  const box=document.getElementById("sites");
  D.runs.forEach(r=>{ [["at_peak","live at the peak of requested memory"],["at_oom","live at the first out-of-memory"],
    ["waste","waste at the peak of reserved memory (reserved - live requested)"]].forEach(([k,title])=>{
    const rows=r.sites[k]; if(!rows||!rows.length) return; box.appendChild(el("h3",{},r.label+": "+title));
    const t=el("table"); const h=el("tr"); ["bytes","allocations","site (innermost program frame)","category"].forEach((x,i)=>h.appendChild(el("th",i>1?{"class":"l"}:{},x))); t.appendChild(h);
    rows.forEach(row=>{ const tr=el("tr"); tr.appendChild(bytesTd(row.bytes)); tr.appendChild(el("td",{},exact(row.count)));
      const td=el("td",{"class":"l"}); if(row.frames&&row.frames.length){ const d=el("details"); d.appendChild(el("summary",{},row.site));
        d.appendChild(el("div",{"class":"frames"},row.frames.join("\n"))); td.appendChild(d); } else td.textContent=row.site;
      if(row.causes) td.appendChild(el("div",{"class":"frames"},Object.entries(row.causes).map(([c,v])=>c.replace(/_/g," ")+" "+both(v)).join(", ")));
      tr.appendChild(td); tr.appendChild(el("td",{"class":"l"},(row.category||"").replace("_"," "))); t.appendChild(tr); });
    box.appendChild(t); }); });
}

// ------------------------------------------------------------------ advice
function advice(){
  const box=document.getElementById("advice"); if(!D.advice){ box.parentNode.removeChild(document.getElementById("advice-title")); box.parentNode.removeChild(box); return; }
  const a=D.advice; box.appendChild(el("p",{},a.fits_any?"Settings that fit, best first: paste the line into your job's environment.":"No setting fits at this capacity."));
  (a.recommendations||[]).forEach((r,i)=>{ box.appendChild(el("div",{},(i+1)+". peak reserved "+both(r.peak_reserved_bytes)+", headroom "+both(r.headroom_bytes)));
    box.appendChild(el("pre",{"class":"paste"},r.line)); });
  if(D.advice_text){ const d=el("details"); d.appendChild(el("summary",{},"the whole advice, as allocsim advise prints it")); d.appendChild(el("pre",{},D.advice_text)); box.appendChild(d); }
}

cuts(); verdicts(); categories(); drawTimeline(); timelineEvents(); catTimelineEvents(); mapEvents(); mapChoices(); sites(); advice();
document.body.dataset.ready="1";
"""


def _js_safe(value: Any) -> Any:
    """``value`` with every integer past ``JS_SAFE_INTEGER`` as its decimal string (the viewer reads it with BigInt)."""
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, int):
        return value if -JS_SAFE_INTEGER <= value <= JS_SAFE_INTEGER else str(value)
    if isinstance(value, dict):
        return {k: _js_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_js_safe(v) for v in value]
    return value


def _json_for_html(data: Any) -> str:
    """JSON that cannot end its ``<script>`` element early (``</`` and ``<!--`` escaped), every number exact in
    JavaScript (``_js_safe``)."""
    text = json.dumps(_js_safe(data), separators=(",", ":"), ensure_ascii=False)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def _escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace('"', "&quot;")


def render(data: dict[str, Any]) -> str:
    """The whole page as one string: open it from disk, nothing else is fetched."""
    title = f"allocsim report — {data.get('trace') or 'trace'}"
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; img-src data:">
<title>{_escape(title)}</title><style>{_STYLE}</style></head>
<body>
<header><h1>{_escape(title)}</h1>
<div>{_escape(data.get('format') or '')} trace, {int(data.get('events') or 0):,} events; every figure is an exact byte count from the replay (allocsim run --fast)</div></header>
<main>
<div id="cuts" class="cuts"></div>
<h2>Verdict</h2><div id="verdicts"></div>
<table id="summary"></table>
<h2>Memory by category</h2><div id="cats" class="cols"></div>
<h2>Recorded and simulated memory over the trace</h2>
<div class="controls">drag to zoom, wheel to zoom at the pointer, <button id="tlreset">show all</button>
each pixel column shows the maximum of the events it covers, so no peak is lost</div>
<canvas id="timeline" width="1200" height="320"></canvas><div id="tllegend" class="legend"></div>
<div>live bytes by category (zooms with the timeline above; colours as in the segment map)</div>
<canvas id="cattimeline" width="1200" height="140"></canvas>
<h2>Segments and blocks</h2>
<div class="controls"><select id="mapsel"></select> <span id="mapnote"></span></div>
<div id="maplegend" class="legend"></div>
<div id="mapwrap"><canvas id="mapcanvas" width="1200" height="556"></canvas><div id="mapspacer"></div></div>
<h2>Code sites</h2><div id="sites"></div>
<h2 id="advice-title">Which setting fits (advise)</h2><div id="advice"></div>
</main><div id="tip"></div>
<script type="application/json" id="data">{_json_for_html(data)}</script>
<script>{_SCRIPT}</script>
</body></html>
"""
