import net from 'node:net';
const socks = [];
const t = setInterval(() => { const s = net.connect(18501, '127.0.0.1'); s.on('error', () => {}); socks.push(s); }, 2);
setTimeout(() => { clearInterval(t); console.log('opened', socks.length); for (const s of socks) s.destroy(); }, 12000);
