import { defineConfig } from 'vite';

// The staff latency dashboard: a separate bundle (dist/dashboard.js + dashboard.css),
// built after the chat UI into the same dist/ (see package.json "build").
export default defineConfig({
  base: '/static/',
  publicDir: false,
  build: {
    outDir: 'dist',
    emptyOutDir: false,
    target: 'es2020',
    cssCodeSplit: false,
    sourcemap: false,
    modulePreload: false,
    rolldownOptions: {
      input: 'src/dashboard/main.ts',
      output: {
        format: 'es',
        entryFileNames: 'dashboard.js',
        chunkFileNames: 'assets/dashboard-[name]-[hash].js',
        assetFileNames: (info) =>
          (info.names || [info.name || '']).some((n) => n && n.endsWith('.css'))
            ? 'dashboard.css'
            : 'assets/[name]-[hash][extname]',
      },
    },
  },
});
